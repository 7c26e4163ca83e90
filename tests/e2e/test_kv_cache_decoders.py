"""Decoders exported with a KV cache, as a user serving generation exports them: tiny random-weight LLaMA
(grouped-query, rotary) and GPT-2, ``past_key_values`` given as inputs, dynamic batch, new length and past
length, with torch's legacy exporter (named dynamic axes) and its dynamo exporter (automatic dims, which name
every past tensor's length and the mask's dims apart). Every attention must fuse, and the build must match torch
within 1e-4 at decode steps (one new token) and prefill chunks, with a left-padded mask; cached key and value
lengths that disagree, and a mask shorter than the cache or with fewer rows than the batch, are refused in one
line. Before 2026-11-25 the dynamo files died inside TVM's FuseTIR and
their attention did not fuse (``tests/test_kv_cache_attention.py`` has the small versions of both)."""

import contextlib
import io
import warnings

import numpy as np
import pytest

from tvm_fusion_ext.compile import fuse
from tvm_fusion_ext.errors import InputError
from tvm_fusion_ext.frontend import load_onnx

pytest.importorskip("torch")
pytest.importorskip("transformers")

LAYERS = 2


def _model(kind):
    import torch
    import transformers

    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                                          max_position_embeddings=128)
        return transformers.LlamaModel(config).eval(), config, 2
    config = transformers.GPT2Config(n_layer=LAYERS, n_embd=64, n_head=4, vocab_size=1000, n_positions=128,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2Model(config).eval(), config, 4


def _with_cache(model, config):
    import torch
    from transformers import DynamicCache

    class WithCache(torch.nn.Module):
        """(input_ids, attention_mask, past_k_0, past_v_0, ...) -> last_hidden_state."""

        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, input_ids, attention_mask, *past):
            cache = DynamicCache(config=config)
            for layer in range(LAYERS):
                cache.update(past[2 * layer], past[2 * layer + 1], layer)
            return self.m(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                          use_cache=True).last_hidden_state

    return WithCache().eval()


NAMES = ["input_ids", "attention_mask"] + [f"past_{kv}_{i}" for i in range(LAYERS) for kv in "kv"]


def _inputs(batch, new, past, kv_heads, seed, past_v=None):
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 1000, (batch, new), generator=g)
    mask = torch.ones(batch, past + new, dtype=torch.int64)
    if batch > 1:
        mask[-1, :2] = 0  # the last row left-padded: its first two cached positions are padding
    out = [ids, mask]
    for _ in range(LAYERS):
        out += [torch.randn(batch, kv_heads, past, 16, generator=g),
                torch.randn(batch, kv_heads, past if past_v is None else past_v, 16, generator=g)]
    return out


def _export(wrapped, example, path, exporter):
    import torch

    kw = dict(input_names=NAMES, output_names=["out"])
    if exporter == "legacy":
        kw.update(opset_version=17, dynamic_axes={"input_ids": {0: "batch", 1: "new"},
                                                  "attention_mask": {0: "batch", 1: "total"},
                                                  **{n: {0: "batch", 2: "past"} for n in NAMES[2:]}})
    else:
        from torch.export import Dim

        auto = Dim.AUTO
        kw.update(opset_version=18, dynamic_shapes={"input_ids": {0: auto, 1: auto},
                                                    "attention_mask": {0: auto, 1: auto},
                                                    "past": tuple({0: auto, 2: auto} for _ in NAMES[2:])})
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapped, tuple(example), str(path), dynamo=exporter == "dynamo", **kw)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_kv_cache_export_fuses_and_matches_torch(export_dir, kind, exporter):
    import torch

    from tvm_fusion_ext.runtime import CompiledModel

    model, config, kv_heads = _model(kind)
    wrapped = _with_cache(model, config)
    path = _export(wrapped, _inputs(2, 3, 5, kv_heads, seed=0), export_dir / f"{kind}-kv-{exporter}.onnx", exporter)
    mod = load_onnx(path)
    _, report = fuse(mod)
    assert report.fused["attention"] == LAYERS, report.summary()
    if kind == "llama":
        assert report.fused["rope"] == 2 * LAYERS and report.fused["gated_mlp"] == LAYERS, report.summary()
    if kind == "gpt2" and exporter == "legacy":
        # the bounds come from the model: positions past .. past + new - 1 gathered from its 128-row table
        from tvm_fusion_ext.frontend.dims import bound_reasons, shape_bounds

        bounds, reasons = shape_bounds(mod), bound_reasons(mod)
        assert (bounds["past"], bounds["new"], bounds["total"]) == ((0, 127), (1, 128), (1, 128)), bounds
        assert "constant table of 128 rows" in reasons["past"]["upper"], reasons
        assert reasons["total"]["upper"].startswith("past + new <= 128"), reasons
    compiled = CompiledModel.from_module(mod)
    # decode steps (one new token) at several cache lengths, and prefill chunks; batch 1 to 3; an empty cache
    # (the first call of Optimum's and ONNX Runtime GenAI's loops: a prompt, or one token, against 0 past keys)
    for batch, new, past in ((2, 3, 5), (1, 1, 9), (3, 1, 17), (2, 4, 2), (2, 4, 0), (1, 1, 0)):
        feeds = _inputs(batch, new, past, kv_heads, seed=batch * 100 + new * 10 + past)
        with torch.no_grad():
            ref = wrapped(*feeds).numpy()
        got = compiled.run({n: x.numpy() for n, x in zip(NAMES, feeds)})["out"]
        # at valid tokens: with an empty past the padding falls on new tokens, whose (fully masked) rows each
        # runtime fills its own way
        valid = feeds[1].numpy()[:, past:] == 1
        np.testing.assert_allclose(got[valid], ref[valid], rtol=1e-4, atol=1e-4, err_msg=f"(batch, new, past) = "
                                                                                          f"{(batch, new, past)}")
    bad = {n: x.numpy() for n, x in zip(NAMES, _inputs(2, 3, 5, kv_heads, seed=1, past_v=4))}
    with pytest.raises(InputError) as err:
        compiled.run(bad)
    assert "\n" not in str(err.value)
    # the legacy export names one past length, so the input check catches it first; dynamo's names them apart
    assert ("dim 2 (past) is 4, but input 'past_k_0' has past = 5" in str(err.value)
            or "the inputs' shapes do not fit together" in str(err.value)), str(err.value)
    # a mask shorter than past + new, or with fewer rows than the batch: ONNX Runtime refuses (Gather/GatherND:
    # invalid index); before indices were checked at run time TVM read past the mask (dynamo) or clamped into it (legacy) and answered
    good = {n: x.numpy() for n, x in zip(NAMES, _inputs(2, 3, 5, kv_heads, seed=1))}
    for mask in (good["attention_mask"][:, :7], good["attention_mask"][:1]):
        with pytest.raises(InputError) as err:  # (the legacy export names the mask's rows "batch": checked first)
            compiled.run(dict(good, attention_mask=mask))
        assert "\n" not in str(err.value) and "input 'attention_mask'" in str(err.value), str(err.value)
