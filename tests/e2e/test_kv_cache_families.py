"""KV-cache exports of families beyond LLaMA and GPT-2, with Optimum's names (``input_ids``, ``attention_mask``,
``position_ids``, ``past_key_values.{i}.key/value`` in; ``logits``, ``present.{i}.key/value`` out) and dynamic
batch, new length and past length: each must fuse what its meaning allows and match ONNX Runtime on decode steps,
prefill chunks and an empty past; or be refused in one line naming the cause.

Mistral's sliding window crops the cache to its last ``window - 1`` positions inside the graph (``Slice`` from
``-7``), while the export's mask keeps ``past + new`` columns; BLOOM's legacy export adds a mask of the input's
``total_sequence_length`` to scores of ``past + new``. TVM cannot show those dims equal, and the scores' sum had no
known shape: TVM's "Check failed: shape_of expects a tensor input" at a later node. The mask is now match-cast to the
scores' dims (a run-time check): both build and fuse, and a Mistral past longer than the window, on which ONNX
Runtime fails as well, is one line naming the inputs."""

import contextlib
import io
import warnings

import numpy as np
import pytest

from tvm_fusion_ext.compile import fuse
from tvm_fusion_ext.errors import InputError
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.models.causal_lm import _with_cache  # the wrapper the package exports decoders with

pytest.importorskip("torch")
pytest.importorskip("transformers")

LAYERS = 2
NAMES = ["input_ids", "attention_mask", "position_ids"] + [f"past_key_values.{i}.{kv}" for i in range(LAYERS)
                                                          for kv in ("key", "value")]
OUTPUTS = ["logits"] + [f"present.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value")]
_TEXT = dict(num_hidden_layers=LAYERS, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=1000, max_position_embeddings=128)
FAMILIES = {
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(_TEXT, sliding_window=8)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(_TEXT, pad_token_id=0)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(_TEXT, head_dim=16)),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(n_layer=LAYERS, hidden_size=64, n_head=4, vocab_size=1000)),
}
KV_HEADS = {"bloom": 4}


def _export(kind, exporter, path):
    import torch
    import transformers

    config_name, model_name, args = FAMILIES[kind]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**args)
    config._attn_implementation = "eager" if kind == "bloom" else "sdpa"  # BLOOM has no SDPA path
    model = getattr(transformers, model_name)(config).eval()

    example = tuple(torch.from_numpy(x) for x in _feeds(2, 3, 5, seed=0, kv_heads=KV_HEADS.get(kind, 2)).values())
    kw = dict(input_names=NAMES, output_names=OUTPUTS)
    if exporter == "legacy":
        kw.update(opset_version=17, dynamic_axes={
            "input_ids": {0: "batch_size", 1: "sequence_length"}, "position_ids": {0: "batch_size", 1: "sequence_length"},
            "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
            **{n: {0: "batch_size", 2: "past_sequence_length"} for n in NAMES[3:]}})
    else:
        from torch.export import Dim

        auto = Dim.AUTO
        kw.update(opset_version=18, dynamic_shapes={"input_ids": {0: auto, 1: auto}, "attention_mask": {0: auto, 1: auto},
                                                    "position_ids": {0: auto, 1: auto},
                                                    "past": tuple({0: auto, 2: auto} for _ in NAMES[3:])})
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(_with_cache(model, config), example, str(path), dynamo=exporter == "dynamo", **kw)
    return str(path)


def _feeds(batch, new, past, seed, kv_heads=2):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, past + new), np.int64)
    if batch > 1 and past >= 2:
        mask[-1, :2] = 0  # the last row left-padded
    feeds = [rng.integers(3, 1000, (batch, new)).astype(np.int64), mask,
             np.maximum(np.cumsum(mask, -1)[:, past:] - 1, 0).astype(np.int64)]
    feeds += [rng.standard_normal((batch, kv_heads, past, 16)).astype(np.float32) for _ in range(2 * LAYERS)]
    return dict(zip(NAMES, feeds))


def _assert_matches_ort(compiled, path, steps, run_ort, kv_heads=2):
    for batch, new, past in steps:
        feeds = _feeds(batch, new, past, seed=batch * 100 + new * 10 + past, kv_heads=kv_heads)
        feeds = {k: v for k, v in feeds.items() if k in compiled.input_specs}  # BLOOM takes no position_ids
        got, ref = compiled.run(feeds), run_ort(path, feeds)
        valid = feeds["attention_mask"][:, past:] == 1  # fully masked rows: each runtime fills its own way
        np.testing.assert_allclose(got["logits"][valid], ref[0][valid], rtol=1e-4, atol=1e-4)
        for name, r in zip(OUTPUTS[1:], ref[1:]):
            np.testing.assert_allclose(got[name], r, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("kind, exporter, counts", [
    ("phi3", "dynamo", dict(attention=2, rope=4, rmsnorm=5, gated_mlp=2)),
    ("qwen3", "legacy", dict(attention=2, rope=4, rmsnorm=9, gated_mlp=2, qkv=2)),
    ("bloom", "legacy", dict(attention=2, layernorm=6)),
    ("mistral", "legacy", dict(attention=2, rope=4, rmsnorm=5, gated_mlp=2, qkv=2)),
])
def test_kv_cache_family_fuses_and_matches_ort(export_dir, run_ort, kind, exporter, counts):
    from tvm_fusion_ext.runtime import CompiledModel

    path = _export(kind, exporter, export_dir / f"{kind}-kv-{exporter}.onnx")
    mod = load_onnx(path)
    _, report = fuse(mod)
    assert {k: report.fused[k] for k in counts} == counts, report.summary()
    compiled = CompiledModel.from_module(mod)
    # pasts within Mistral's window of 8 (its cache keeps 7 positions)
    _assert_matches_ort(compiled, path, ((2, 3, 5), (1, 1, 6), (2, 4, 0)), run_ort, KV_HEADS.get(kind, 2))
    if kind == "mistral":
        # past the window the crop leaves 7 cached keys beside a mask of 9 + 1 columns: ONNX Runtime fails on the
        # file, and the build's check names the inputs
        feeds = _feeds(1, 1, 9, seed=1)
        with pytest.raises(InputError) as info:
            compiled.run(feeds)
        assert "\n" not in str(info.value) and "do not fit together" in str(info.value), info.value


@pytest.mark.slow
def test_a_dynamo_export_with_a_window_wider_than_the_capacity_runs_in_place(export_dir, run_ort):
    """torch's dynamo exporter names each past's length apart when a window's crop hides that they are equal; the
    in-place build defines them all by ``past_length``, drops the crops (the window, 64, keeps more than the
    capacity, 32) and matches ONNX Runtime's logits from an empty past to a full buffer."""
    from tvm_fusion_ext.compile.artifact import compile_artifact
    from tvm_fusion_ext.deploy import load

    FAMILIES["mistral-wide"] = (*FAMILIES["mistral"][:2], dict(FAMILIES["mistral"][2], sliding_window=64))
    path = _export("mistral-wide", "dynamo", export_dir / "mistral-wide-kv-dynamo.onnx")
    pasts = [i for i in load_onnx(path)["main"].params if "past" in i.name]
    assert len({str(p.ty.shape.values[2]) for p in pasts}) > 1, "the export no longer names the pasts apart"
    out = export_dir / "mistral-wide-inplace"
    compile_artifact(path, str(out), target={"kind": "llvm", "num-cores": 2}, kv_cache="inplace",
                     max_shapes={"past_key_values.*": [2, 2, 32, 16], "attention_mask": [2, 33]})
    artifact = load(str(out))
    for batch, new, past in ((2, 5, 0), (2, 1, 5), (1, 3, 20), (2, 1, 31)):
        feeds = _feeds(batch, new, past, seed=past)
        want = run_ort(path, feeds)
        buffers = {n: np.zeros((batch, 2, 32, 16), np.float32) for n in NAMES[3:]}
        for n in NAMES[3:]:
            buffers[n][:, :, :past] = feeds[n]
        got = artifact.run({**{k: feeds[k] for k in NAMES[:3]}, **buffers, "past_length": np.array([past], np.int64)})
        valid = feeds["attention_mask"][:, past:] == 1
        np.testing.assert_allclose(got["logits"][valid], want[0][valid], rtol=1e-4, atol=1e-4,
                                   err_msg=f"{new} new, past {past}")
