"""Generation over a compiled KV-cache decoder (``deploy.generate``): a prefill against an empty past, then one
token per step with ``present`` fed back as ``past``. Greedy tokens equal transformers' greedy ``generate`` on the
same random-weight LLaMA, for a batch with a left-padded row, and stop at EOS (one id or a list, rows finishing
at different steps) as it does; sampled tokens equal transformers' ``generate`` with its own processors drawing
from the same uniform numbers (:mod:`_generation_reference`); the same seed repeats; streaming gives each step's
tokens; the timings exist; a generation past the model's bounds is refused before its first call."""

import numpy as np
import pytest

from tvm_fusion_ext.deploy.generate import DecoderIO, generate, generate_stream
from tvm_fusion_ext.errors import InputError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def compiled_tiny_lm(tiny_causal_lm):
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.runtime import CompiledModel

    return CompiledModel.from_module(load_onnx(tiny_causal_lm), fuse=True)


def _torch_greedy(ids, mask, new, eos=None):
    from tvm_fusion_ext.models.causal_lm import causal_lm

    model, _ = causal_lm("tiny")  # seed 0: the weights the export has
    with torch.no_grad():
        out = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=new,
                             do_sample=False, eos_token_id=eos, pad_token_id=0 if eos is None else eos)
    return out.numpy()


def test_greedy_tokens_equal_transformers_generate(compiled_tiny_lm):
    ids = np.array([[11, 57, 300, 42, 7], [0, 0, 99, 512, 3]], np.int64)
    mask = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], np.int64)  # the second prompt left-padded
    got = generate(compiled_tiny_lm, ids, max_new_tokens=12, attention_mask=mask)
    np.testing.assert_array_equal(got, _torch_greedy(ids, mask, 12))
    assert got.shape == (2, 17)


def test_generation_stops_at_eos_like_transformers(compiled_tiny_lm):
    ids = np.array([[11, 57, 300, 42, 7]], np.int64)
    free = generate(compiled_tiny_lm, ids, max_new_tokens=8)
    eos = int(free[0, 5 + 2])  # the third generated token: generation must stop right after it
    got = generate(compiled_tiny_lm, ids, max_new_tokens=8, eos_token_id=eos)
    np.testing.assert_array_equal(got, _torch_greedy(ids, np.ones_like(ids), 8, eos=eos))
    assert got.shape[1] <= 5 + 3 and got[0, -1] == eos


def test_bad_calls_are_one_line_errors(compiled_tiny_lm):
    with pytest.raises(InputError, match="input_ids must be a"):
        generate(compiled_tiny_lm, np.zeros((2,), np.int64))
    with pytest.raises(InputError, match="attention_mask has shape"):
        generate(compiled_tiny_lm, np.ones((1, 3), np.int64), attention_mask=np.ones((1, 4), np.int64))

    class Encoder:
        input_specs = {"input_ids": (("b", "s"), "int64"), "attention_mask": (("b", "s"), "int64")}
        output_names = ["last_hidden_state"]

    with pytest.raises(InputError, match="no past"):
        DecoderIO(Encoder())


# -- sampling, stopping, streaming, timings ---------------------------------------------------------------------

PROMPT = np.array([[11, 57, 300, 42, 7], [0, 0, 99, 512, 3]], np.int64)
PROMPT_MASK = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], np.int64)  # the second prompt left-padded


@pytest.mark.parametrize("settings", [
    {"temperature": 0.8, "top_k": 50, "top_p": 0.95},
    {"repetition_penalty": 1.3, "top_k": 0},
    {"temperature": 1.5, "top_k": 10, "top_p": 0.9, "repetition_penalty": 1.2},
])
def test_sampled_tokens_equal_transformers_with_the_same_uniforms(compiled_tiny_lm, settings):
    """transformers' generate with its own processors, drawing from the same per-step uniform numbers."""
    from _generation_reference import transformers_generate

    got = generate(compiled_tiny_lm, PROMPT, 12, PROMPT_MASK, do_sample=True, seed=123, **settings)
    want = transformers_generate(PROMPT, PROMPT_MASK, 12, do_sample=True, seed=123, **settings)
    np.testing.assert_array_equal(got, want)


def test_greedy_with_a_repetition_penalty_equals_transformers(compiled_tiny_lm):
    from _generation_reference import transformers_generate

    got = generate(compiled_tiny_lm, PROMPT, 12, PROMPT_MASK, repetition_penalty=1.5)
    np.testing.assert_array_equal(got, transformers_generate(PROMPT, PROMPT_MASK, 12, repetition_penalty=1.5))
    assert (got != generate(compiled_tiny_lm, PROMPT, 12, PROMPT_MASK)).any()  # the penalty changed something


def test_sampling_with_top_k_1_or_a_tiny_temperature_is_greedy(compiled_tiny_lm):
    greedy = generate(compiled_tiny_lm, PROMPT, 10, PROMPT_MASK)
    for settings in ({"top_k": 1}, {"temperature": 1e-4, "top_k": 0}, {"top_p": 0.0}):
        np.testing.assert_array_equal(
            generate(compiled_tiny_lm, PROMPT, 10, PROMPT_MASK, do_sample=True, seed=9, **settings), greedy,
            err_msg=str(settings))


def test_the_same_seed_gives_the_same_tokens(compiled_tiny_lm):
    first = generate(compiled_tiny_lm, PROMPT, 10, PROMPT_MASK, do_sample=True, seed=5)
    np.testing.assert_array_equal(generate(compiled_tiny_lm, PROMPT, 10, PROMPT_MASK, do_sample=True, seed=5), first)
    np.testing.assert_array_equal(generate(compiled_tiny_lm, PROMPT, 10, PROMPT_MASK, do_sample=True,
                                           rng=np.random.default_rng(5)), first)
    assert (generate(compiled_tiny_lm, PROMPT, 10, PROMPT_MASK, do_sample=True, seed=6) != first).any()


def test_rows_stop_at_different_times_on_a_list_of_eos_ids(compiled_tiny_lm):
    from _generation_reference import transformers_generate

    free = generate(compiled_tiny_lm, PROMPT, 10, PROMPT_MASK)[:, 5:]
    eos = [int(free[0, 1]), int(free[1, 5])]  # row 0 stops after its 2nd token, row 1 after its 6th at the latest
    got = generate(compiled_tiny_lm, PROMPT, 10, PROMPT_MASK, eos_token_id=eos, pad_token_id=0)
    np.testing.assert_array_equal(got, transformers_generate(PROMPT, PROMPT_MASK, 10, eos=eos, pad=0))
    new = got[:, 5:]
    assert new[0, 1] == eos[0] and (new[0, 2:] == 0).all()     # padding after row 0's eos
    assert new.shape[1] <= 6 and np.isin(new[1, -1], eos)       # the loop ends once row 1 stops too
    sampled = generate(compiled_tiny_lm, PROMPT, 10, PROMPT_MASK, eos_token_id=eos, do_sample=True, seed=1,
                       top_k=3)
    np.testing.assert_array_equal(sampled, transformers_generate(PROMPT, PROMPT_MASK, 10, eos=eos, do_sample=True,
                                                                 seed=1, top_k=3))


def test_no_new_tokens_and_a_one_token_prompt(compiled_tiny_lm):
    from _generation_reference import transformers_generate

    tokens, stats = generate(compiled_tiny_lm, PROMPT.astype(np.int32), 0, PROMPT_MASK, return_stats=True)
    np.testing.assert_array_equal(tokens, PROMPT)
    assert tokens.dtype == np.int64 and stats.new_tokens == 0 and stats.time_to_first_token_s == 0.0
    assert list(generate_stream(compiled_tiny_lm, PROMPT, 0)) == []
    one = np.array([[42], [7]], np.int64)
    np.testing.assert_array_equal(generate(compiled_tiny_lm, one, 6),
                                  transformers_generate(one, np.ones_like(one), 6))
    np.testing.assert_array_equal(generate(compiled_tiny_lm, one, 6, do_sample=True, seed=2, temperature=0.7),
                                  transformers_generate(one, np.ones_like(one), 6, do_sample=True, seed=2,
                                                        temperature=0.7))


def test_streaming_gives_each_steps_tokens_as_they_come(compiled_tiny_lm):
    whole = generate(compiled_tiny_lm, PROMPT, 6, PROMPT_MASK, do_sample=True, seed=4)
    stream = generate_stream(compiled_tiny_lm, PROMPT, 6, PROMPT_MASK, do_sample=True, seed=4)
    seen = []
    for step, new in enumerate(stream):
        assert new.shape == (2,) and new.dtype == np.int64
        assert stream.tokens.shape[1] == 5 + step + 1   # the step's tokens are in before the next step runs
        seen.append(new)
    np.testing.assert_array_equal(np.stack(seen, axis=1), whole[:, 5:])
    np.testing.assert_array_equal(stream.tokens, whole)

    called = []
    generate(compiled_tiny_lm, PROMPT, 6, PROMPT_MASK, do_sample=True, seed=4, streamer=called.append)
    np.testing.assert_array_equal(np.stack(called, axis=1), whole[:, 5:])

    class Streamer:  # transformers' protocol: put(prompt), put(step tokens)..., end()
        def __init__(self):
            self.puts, self.ended = [], False

        def put(self, value):
            self.puts.append(np.asarray(value))

        def end(self):
            self.ended = True

    s = Streamer()
    generate(compiled_tiny_lm, PROMPT, 6, PROMPT_MASK, do_sample=True, seed=4, streamer=s)
    np.testing.assert_array_equal(s.puts[0], PROMPT)
    np.testing.assert_array_equal(np.stack(s.puts[1:], axis=1), whole[:, 5:])
    assert s.ended


def test_stats_report_time_to_first_token_and_decode_steps(compiled_tiny_lm):
    tokens, stats = generate(compiled_tiny_lm, PROMPT, 8, PROMPT_MASK, return_stats=True)
    assert tokens.shape == (2, 13)
    assert stats.batch == 2 and stats.prompt_tokens == 8 and stats.new_tokens == 16 and stats.decode_tokens == 14
    assert len(stats.step_times_s) == 7 and all(t > 0 for t in stats.step_times_s)
    assert stats.time_to_first_token_s > 0 and stats.decode_s > 0 and stats.step_s > 0 and stats.tokens_per_s > 0
    assert set(stats.to_dict()) >= {"time_to_first_token_s", "step_s", "tokens_per_s", "decode_steps"}
    assert "time to first token" in stats.summary() and "tokens/s" in stats.summary()


def test_a_generation_past_the_bounds_is_refused_before_it_starts(compiled_tiny_lm):
    calls = []

    class Counting:  # the model, counting its calls
        def __getattr__(self, name):
            return getattr(compiled_tiny_lm, name)

        def run(self, feeds):
            calls.append(1)
            return compiled_tiny_lm.run(feeds)

    upper = compiled_tiny_lm.bounds["total_sequence_length"][1]
    with pytest.raises(InputError, match=f"reach {upper + 1} positions at the last step, past the bound {upper} of "
                                         f"attention_mask.*at most {upper - 4} new tokens fit") as err:
        generate(Counting(), PROMPT, upper - 3, PROMPT_MASK)
    assert not calls and "\n" not in str(err.value)


def test_bad_generation_settings_are_one_line_errors(compiled_tiny_lm):
    for kwargs, match in (({"eos_token_id": []}, "eos_token_id must be"), ({"eos_token_id": "2"}, "eos_token_id"),
                          ({"streamer": 3}, "streamer must be a callable"),
                          ({"max_new_tokens": -1}, "max_new_tokens must be an integer >= 0"),
                          ({"do_sample": True, "temperature": 0.0}, "temperature must be"),
                          ({"seed": 1, "rng": np.random.default_rng(1)}, "seed or rng")):
        with pytest.raises(InputError, match=match):
            generate(compiled_tiny_lm, PROMPT, **kwargs)
