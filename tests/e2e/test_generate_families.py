"""``deploy.generate`` on KV-cache decoder families beyond LLaMA, as a team serving one compiles it: tiny
random-weight models (1 layer) exported with Optimum's names by the package's own wrapper, compiled as artifacts
with both caches (``concat``, the default, and ``inplace``), then greedy generation over a batch with a
left-padded row and over a single prompt. The tokens must equal ONNX Runtime's greedy loop on the same file
(prefill, then one token per step feeding ``present`` back as ``past``, positions from the mask's cumsum), and
transformers' own ``generate`` on the same model.

* Mistral with a sliding window of 8: its export crops the cache to the last 7 positions inside the graph, so
  ``present`` is shorter than ``past + new``; the next step's mask must cover just those kept positions (the
  graph lines its columns up with the cache), or the left-padded row's padding lands on the wrong keys and its
  tokens drift from transformers' after the window passes (the whole mask gave wrong tokens, silently, before
  2026-11-29). The in-place build cannot drop positions from a buffer: refused in one line naming the sliding
  window. A window wider than the cache's capacity (64 over 32 positions) never drops one: that build drops
  the crop and generates in place.
* BLOOM: ALiBi, no ``position_ids`` input.
* Falcon (7B's layout): multi-query attention (one K/V head for every query head), rotary positions.

GPT-2, OPT, GPT-J, Phi-3, GPT-BigCode (multi-query) and Gemma2 were checked the same way (docs/coverage.md,
"Generation"); they needed no change, and their compiles would take this file past its few minutes.
"""

import contextlib
import io
import warnings

import numpy as np
import pytest

from tvm_fusion_ext.errors import InputError

ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NEW_TOKENS, CAPACITY = 12, 32
FAMILIES = {
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=128, vocab_size=1000, max_position_embeddings=128, sliding_window=8)),
    "mistral-wide": ("MistralConfig", "MistralForCausalLM",
                     dict(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=128, vocab_size=1000, max_position_embeddings=128, sliding_window=64)),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(n_layer=1, hidden_size=64, n_head=4, vocab_size=1000)),
    "falcon": ("FalconConfig", "FalconForCausalLM",
               dict(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, vocab_size=1000,
                    new_decoder_architecture=False, multi_query=True, alibi=False)),
}
PROMPTS = [
    (np.array([[11, 57, 300, 42, 7], [0, 0, 99, 512, 3]], np.int64), np.array([[1] * 5, [0, 0, 1, 1, 1]], np.int64)),
    (np.array([[23, 5, 812]], np.int64), np.ones((1, 3), np.int64)),
]


def _model(kind):
    config_name, model_name, args = FAMILIES[kind]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**args, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config._attn_implementation = "eager"
    return getattr(transformers, model_name)(config).eval(), config


def _export(kind, path):
    """``(torch model, path, kv_heads, head_dim)``: the model exported as Optimum names a decoder's inputs."""
    from tvm_fusion_ext.models.causal_lm import _with_cache, past_names, present_names

    model, config = _model(kind)
    kv_heads = 1 if kind == "falcon" else config.num_attention_heads if kind == "bloom" else 2
    head_dim = 16
    names = ["input_ids", "attention_mask", "position_ids", *past_names(1)]
    example = (torch.randint(3, 1000, (2, 3)), torch.ones(2, 8, dtype=torch.int64), torch.arange(5, 8).repeat(2, 1),
               *(torch.randn(2, kv_heads, 5, head_dim) for _ in range(2)))
    axes = {"input_ids": {0: "batch_size", 1: "sequence_length"},
            "position_ids": {0: "batch_size", 1: "sequence_length"},
            "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
            **{n: {0: "batch_size", 2: "past_sequence_length"} for n in past_names(1)}}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(_with_cache(model, config), example, str(path), dynamo=False, opset_version=17,
                          input_names=names, output_names=["logits", *present_names(1)], dynamic_axes=axes)
    return model, str(path), kv_heads, head_dim


def _ort_greedy(path, ids, mask):
    """ONNX Runtime's greedy loop on the exported file; each step's mask covers the positions its past holds
    (all of them, or a sliding window's last ones) and the new token."""
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    batch = ids.shape[0]
    past = {n: np.zeros((batch, inputs[n].shape[1], 0, inputs[n].shape[3]), np.float32) for n in inputs if "past" in n}
    tokens, step_ids, full_mask = ids, ids, mask
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    for _ in range(NEW_TOKENS):
        covered = next(iter(past.values())).shape[2] + step_ids.shape[1]
        feeds = {"input_ids": step_ids, "attention_mask": full_mask[:, full_mask.shape[1] - covered:], **past}
        if "position_ids" in inputs:
            feeds["position_ids"] = positions
        out = dict(zip(outputs, session.run(None, feeds)))
        nxt = out["logits"][:, -1].argmax(-1).astype(np.int64)
        tokens = np.concatenate([tokens, nxt[:, None]], axis=1)
        past = {n: out[n.replace("past_key_values", "present")] for n in past}
        full_mask = np.concatenate([full_mask, np.ones((batch, 1), np.int64)], axis=1)
        positions, step_ids = positions[:, -1:] + 1, nxt[:, None]
    return tokens


def _transformers_greedy(model, ids, mask):
    with torch.no_grad():
        return model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                              max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None).numpy()


@pytest.fixture(scope="module")
def family(export_dir):
    made = {}

    def get(kind):
        if kind not in made:
            made[kind] = _export(kind, export_dir / f"{kind}-generate.onnx")
        return made[kind]

    return get


def _compile(path, out, kv_cache, kv_heads, head_dim):
    from tvm_fusion_ext.compile.artifact import compile_artifact
    from tvm_fusion_ext.deploy import load

    compile_artifact(path, str(out), target={"kind": "llvm", "num-cores": 2}, kv_cache=kv_cache,
                     max_shapes={"past_key_values.*": [2, kv_heads, CAPACITY, head_dim],
                                 "attention_mask": [2, CAPACITY]})
    return load(str(out))


@pytest.mark.slow
@pytest.mark.parametrize("kv_cache", ["concat", "inplace"])
@pytest.mark.parametrize("kind", ["bloom", "falcon", "mistral"])
def test_generated_tokens_equal_onnxruntime_and_transformers(family, tmp_path, kind, kv_cache):
    model, path, kv_heads, head_dim = family(kind)
    if kind == "mistral" and kv_cache == "inplace":
        with pytest.raises(InputError) as info:
            _compile(path, tmp_path / "art", kv_cache, kv_heads, head_dim)
        assert "\n" not in str(info.value) and "sliding-window" in str(info.value), info.value
        assert "--kv-cache concat" in str(info.value), info.value
        return
    _generates_as_onnxruntime_and_transformers(kind, model, path, _compile(path, tmp_path / "art", kv_cache, kv_heads,
                                                                          head_dim), kv_cache)


@pytest.mark.slow
def test_a_window_wider_than_the_capacity_generates_in_place(family, tmp_path):
    import onnx

    model, path, kv_heads, head_dim = family("mistral-wide")
    crops = [n for n in onnx.load(path).graph.node if n.op_type == "Slice"]
    assert crops, "the export no longer crops its cache: this test would not test the crop"
    artifact = _compile(path, tmp_path / "art", "inplace", kv_heads, head_dim)
    assert artifact.manifest["kv_cache"]["mode"] == "inplace"
    _generates_as_onnxruntime_and_transformers("mistral-wide", model, path, artifact, "inplace")


def _generates_as_onnxruntime_and_transformers(kind, model, path, artifact, kv_cache):
    from tvm_fusion_ext.deploy import generate

    if kind == "bloom":
        assert "position_ids" not in artifact.input_specs  # ALiBi: positions come from the mask
    for ids, mask in PROMPTS:
        got = generate(artifact, ids, NEW_TOKENS, mask)
        np.testing.assert_array_equal(got, _ort_greedy(path, ids, mask), err_msg=f"{kind} {kv_cache} batch "
                                                                                f"{ids.shape[0]}")
        np.testing.assert_array_equal(got, _transformers_greedy(model, ids, mask))
