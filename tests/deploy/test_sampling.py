"""Token choice (``deploy.sampling``): the processed scores and distributions equal those of transformers' own
``RepetitionPenaltyLogitsProcessor``, ``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and ``TopPLogitsWarper``
applied in ``generate``'s order on random logits; a draw is the inverse CDF of the given uniform numbers (checked
against torch's ``searchsorted``) and never picks a token of probability 0; bad settings are one-line errors."""

import numpy as np
import pytest

from tvm_fusion_ext.deploy.sampling import Sampling, TokenChooser, draw, make_rng, softmax
from tvm_fusion_ext.errors import InputError

torch = pytest.importorskip("torch")
logits_process = pytest.importorskip("transformers.generation.logits_process")

VOCAB = 1000


def _reference(scores, tokens, do_sample, temperature, top_k, top_p, penalty):
    """transformers' processors as ``generate`` builds them for these settings (``_get_logits_processor``)."""
    lp = logits_process
    processors = []
    if penalty != 1.0:
        processors.append(lp.RepetitionPenaltyLogitsProcessor(penalty=float(penalty)))
    if do_sample:
        if temperature != 1.0:
            processors.append(lp.TemperatureLogitsWarper(float(temperature)))
        if top_k != 0:
            processors.append(lp.TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
        if top_p < 1.0:
            processors.append(lp.TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
    out = torch.from_numpy(scores.copy())
    for p in processors:
        out = p(torch.from_numpy(tokens), out)
    return out.numpy(), torch.softmax(out, dim=-1).numpy()


SETTINGS = [  # (do_sample, temperature, top_k, top_p, repetition_penalty)
    (True, 1.0, 0, 1.0, 1.0),
    (True, 0.7, 50, 1.0, 1.0),
    (True, 1.3, 0, 0.9, 1.0),
    (True, 0.8, 40, 0.95, 1.2),
    (True, 1.0, 1, 1.0, 1.0),
    (True, 1.0, 0, 0.0, 1.0),      # top_p 0 keeps the most likely token alone
    (True, 0.5, 5000, 0.5, 0.8),   # top_k past the vocabulary; a penalty < 1 favours repeats
    (True, 2.0, 3, 0.999, 1.5),
    (False, 0.3, 7, 0.5, 1.3),     # greedy: only the repetition penalty acts, as in transformers
]


@pytest.mark.parametrize("do_sample,temperature,top_k,top_p,penalty", SETTINGS)
def test_processed_distribution_equals_transformers_processors(do_sample, temperature, top_k, top_p, penalty):
    rng = np.random.default_rng(11)
    scores = (rng.standard_normal((4, VOCAB)) * 3).astype(np.float32)
    tokens = rng.integers(0, VOCAB, (4, 12)).astype(np.int64)
    sampling = Sampling(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                        repetition_penalty=penalty)
    got = sampling.process(scores, tokens)
    want, want_probs = _reference(scores, tokens, do_sample, temperature, top_k, top_p, penalty)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))   # the same tokens filtered
    kept = ~np.isinf(want)
    np.testing.assert_allclose(got[kept], want[kept], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(softmax(got.astype(np.float64)), want_probs, rtol=1e-5, atol=1e-7)
    if do_sample and top_p == 0.0:
        assert (kept.sum(axis=-1) == 1).all()


def test_top_k_keeps_ties_with_the_kth_score_as_transformers_does():
    scores = np.array([[3.0, 1.0, 2.0, 2.0, 0.5, 2.0]], np.float32)
    tokens = np.zeros((1, 1), np.int64)
    got = Sampling(do_sample=True, top_k=2).process(scores, tokens)
    want, _ = _reference(scores, tokens, True, 1.0, 2, 1.0, 1.0)
    np.testing.assert_array_equal(got, want)
    assert np.isfinite(got).sum() == 4   # 3.0 and the three tied 2.0s


def test_repetition_penalty_counts_prompt_padding_and_ids_past_the_vocabulary_are_ignored():
    scores = np.array([[1.0, -1.0, 2.0, -2.0]], np.float32)
    tokens = np.array([[0, 0, 1, 9]], np.int64)   # 0: padding, penalised as transformers does; 9: past the head
    got = Sampling(repetition_penalty=2.0).process(scores, tokens)
    want, _ = _reference(scores, tokens, False, 1.0, 0, 1.0, 2.0)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, [[0.5, -2.0, 2.0, -2.0]])


def test_draw_is_the_inverse_cdf_of_the_uniforms():
    rng = np.random.default_rng(5)
    probs = softmax(rng.standard_normal((64, 50)) * 2)
    probs[:, ::3] = 0.0   # filtered tokens
    uniforms = rng.random(64)
    uniforms[:3] = [0.0, np.nextafter(1.0, 0.0), 0.5]
    got = draw(probs, uniforms)
    t = torch.from_numpy(probs)
    cdf = torch.cumsum(t, dim=-1)
    want = torch.searchsorted(cdf, torch.from_numpy(uniforms)[:, None] * cdf[:, -1:], right=True)[:, 0]
    want = torch.minimum(want, torch.tensor(probs.shape[1] - 1))
    np.testing.assert_array_equal(got, want.numpy())
    assert (probs[np.arange(64), got] > 0).all()   # u = 0 or u -> 1 never lands on a token of probability 0


def test_draw_frequencies_follow_the_distribution():
    probs = np.array([[0.1, 0.0, 0.6, 0.3]])
    rng = np.random.default_rng(0)
    picks = np.concatenate([draw(probs, rng.random(1)) for _ in range(4000)])
    freq = np.bincount(picks, minlength=4) / picks.size
    np.testing.assert_allclose(freq, probs[0], atol=0.03)
    assert freq[1] == 0


def test_chooser_is_greedy_without_sampling_and_reproducible_with_a_seed():
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((3, VOCAB)).astype(np.float32)
    tokens = np.zeros((3, 1), np.int64)
    np.testing.assert_array_equal(TokenChooser(Sampling())(logits, tokens), logits.argmax(-1))
    np.testing.assert_array_equal(TokenChooser(Sampling(do_sample=True, top_k=1), make_rng(0, None))(logits, tokens),
                                  logits.argmax(-1))
    a = [TokenChooser(Sampling(do_sample=True), make_rng(7, None))(logits, tokens) for _ in range(2)]
    np.testing.assert_array_equal(*a)


@pytest.mark.parametrize("kwargs,match", [
    ({"do_sample": True, "temperature": 0.0}, "temperature must be a number > 0"),
    ({"temperature": float("nan")}, "temperature must be"),
    ({"top_k": -1}, "top_k must be an integer >= 0"),
    ({"top_k": 2.5}, "top_k must be an integer"),
    ({"top_p": 1.5}, r"top_p must be a number in \[0, 1\]"),
    ({"repetition_penalty": 0}, "repetition_penalty must be a number > 0"),
])
def test_bad_settings_are_one_line_errors(kwargs, match):
    with pytest.raises(InputError, match=match) as err:
        Sampling(**kwargs)
    assert "\n" not in str(err.value)


def test_seed_and_rng_are_checked():
    with pytest.raises(InputError, match="seed or rng, not both"):
        make_rng(0, np.random.default_rng(0))
    with pytest.raises(InputError, match="rng must be a numpy.random.Generator"):
        make_rng(None, 3)
    with pytest.raises(InputError, match="seed must be an integer >= 0"):
        make_rng(-1, None)
    assert make_rng(None, None) is None


@pytest.mark.parametrize("do_sample,temperature,top_k,top_p,penalty", SETTINGS)
@pytest.mark.parametrize("spread", [0.5, 4.0])   # a flat distribution (a wide nucleus) and a peaked one
def test_chooser_takes_the_tokens_of_the_full_vocabulary_definition(do_sample, temperature, top_k, top_p, penalty,
                                                                    spread):
    """The chooser samples among candidates only; its tokens are those of a draw from the softmax of every
    processed score (the definition the tests above check against transformers), for the same uniforms."""
    rng = np.random.default_rng(3)
    scores = (rng.standard_normal((64, 32000)) * spread).astype(np.float32)
    tokens = rng.integers(0, 32000, (64, 40)).astype(np.int64)
    sampling = Sampling(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                        repetition_penalty=penalty)
    got = TokenChooser(sampling, np.random.default_rng(9))(scores, tokens)
    processed = sampling.process(scores, tokens)
    want = (draw(softmax(processed.astype(np.float64)), np.random.default_rng(9).random(64)) if do_sample
            else processed.argmax(-1))
    np.testing.assert_array_equal(got, want)
