"""Decoder attention: rotary Q/K (FuseRotaryEmbedding, then read through by FuseMultiHeadAttention), K/V heads
repeated for grouped-query attention, constant causal masks. Each fused graph is checked against the unfused
one and against numpy; near misses are refused with a reason and leave the module alone."""

import numpy as np
import pytest
import tvm

from tvm_fusion_ext.ops import params_of
from tvm_fusion_ext.testing import assert_refused, fuse, fused_calls, random_inputs, run_before_after
from tvm_fusion_ext.transform import FuseMultiHeadAttention, FuseRotaryEmbedding
from tvm_fusion_ext.transform.rope import RotaryEmbeddingRule

from _decoder_graphs import B, D, H, S, decoder_attention, numpy_decoder_attention

STEPS = (FuseRotaryEmbedding(), FuseMultiHeadAttention())


def _params(mod, op):
    funcs = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    return [params_of(f) for f in funcs if f.attrs is not None and f.attrs.get("tfx.op") == op]


def _check(kv_heads=2, rope="half", repeat="expand", **kw):
    mod, weights = decoder_attention(kv_heads=kv_heads, rope=rope, repeat=repeat, **kw)
    fused, report = fuse(mod, *STEPS)
    assert fused_calls(fused) == {"fused_attention": 1}, report.summary()
    inputs = random_inputs(mod, seed=1)
    expected, actual = run_before_after(mod, fused, inputs)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
    ref = numpy_decoder_attention(inputs[0], weights, kv_heads=kv_heads, rope=rope, repeat=repeat,
                                  causal=kw.get("causal", True))
    np.testing.assert_allclose(actual, ref, rtol=1e-4, atol=1e-5)
    (params,) = _params(fused, "fused_attention")
    return fused, report, params


@pytest.mark.parametrize("kv_heads,repeat", [(2, "expand"), (1, "expand"), (2, "repeat"), (H, "none")])
def test_grouped_kv_is_read_unrepeated(kv_heads, repeat):
    fused, report, params = _check(kv_heads=kv_heads, rope=None, repeat=repeat)
    assert params["causal"] is True
    # the operator reads K and V with their own head count: nothing of B·H·S·D is built for them
    k_shapes = [list(f.params[1].ty.shape) for _, f in fused.functions_items()
                if isinstance(f, tvm.tirx.PrimFunc) and f.attrs.get("tfx.op") == "fused_attention"]
    assert [int(d) for d in k_shapes[0]] in ([B, S, kv_heads, D], [B, kv_heads, S, D])
    if kv_heads < H:
        assert f"{kv_heads} K/V heads for {H} query heads" in report.applied[-1].detail


def test_tiled_kv_heads_are_read_as_tiled():
    # tile: query head i reads K/V head i mod Hkv, not the operator's i // group: the fused op must read the
    # tiled copy (H heads), not the K/V it was made from
    fused, report, params = _check(kv_heads=2, rope=None, repeat="tile")
    assert "K/V heads for" not in report.applied[-1].detail
    k_shape = [int(d) for d in [f for _, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
                                and f.attrs.get("tfx.op") == "fused_attention"][0].params[1].ty.shape]
    assert H in k_shape[1:3]


@pytest.mark.parametrize("rope,neg", [("half", "negative"), ("half", "multiply"), ("interleaved", "negative")])
def test_rotary_q_and_k_are_read_rotated(rope, neg):
    fused, report, params = _check(rope=rope, neg=neg)
    assert report.fused["rope"] == 2
    assert params["q_rope"] == params["k_rope"] == rope
    assert "fused_rope" not in fused_calls(fused)  # absorbed: no rotated copy of Q or K is written


@pytest.mark.parametrize("cos_shape", ["SD", "B1SD"])
def test_rotary_tables_of_other_shapes(cos_shape):
    _, _, params = _check(rope="half", cos_shape=cos_shape)
    assert params["q_rope"] == "half"


def test_rotary_alone_becomes_one_kernel():
    # without the attention pass the rotation still fuses, and computes the same
    mod, _ = decoder_attention(rope="interleaved")
    fused, report = fuse(mod, FuseRotaryEmbedding())
    assert fused_calls(fused) == {"fused_rope": 2}
    assert {p["style"] for p in _params(fused, "fused_rope")} == {"interleaved"}
    expected, actual = run_before_after(mod, fused, random_inputs(mod, seed=2))
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_rotation_with_another_split_is_refused():
    mod, _ = decoder_attention(rope="half", split=3)
    assert_refused(mod, RotaryEmbeddingRule(), reason="not the two halves of the head dim 8")


def test_tables_varying_over_heads_are_refused():
    mod, _ = decoder_attention(kv_heads=H, repeat="none", rope="half", cos_heads=True)
    assert_refused(mod, RotaryEmbeddingRule(), reason="no axis is the heads axis")


def test_rotary_attention_without_causal_mask():
    _, _, params = _check(rope="half", causal=False)
    assert params["causal"] is False
