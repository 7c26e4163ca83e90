"""DropLowestClamp: ``maximum(s, finfo.min)`` over finite scores is the identity and goes, so that XGLM's
clamped attention (3-D ``[B·H, S, D]`` batched matmuls, the mask added on a ``[B, H, S, T]`` view, the clamp,
the softmax back on ``[B·H, S, T]``) fuses; a real clamp, or one over scores that may be -inf, stays."""

import numpy as np
import pytest
from tvm import relax

from tvm_fusion_ext.testing import assert_refused, build_module, fuse, fused_calls, random_inputs, run_before_after
from tvm_fusion_ext.transform.canonical.lowest_clamp import DropLowestClamp

B, H, S, D = 2, 4, 6, 8
F32_MIN = float(np.finfo(np.float32).min)


def _c(v, dtype="float32"):
    return relax.const(np.asarray(v, dtype))


def xglm_attention(floor=F32_MIN, mask_fill=F32_MIN, floor_first=False, float_mask=False):
    """XGLM's eager attention on [B, S, H·D] projections q (pre-scaled), k, v and a [B, S] padding mask."""
    q, k, v = (relax.Var(n, relax.TensorType((B, S, H * D), "float32")) for n in "qkv")
    m = relax.Var("m", relax.TensorType((B, 1, 1, S), "float32" if float_mask else "bool"))

    def heads(bb, x):  # [B, S, H·D] -> [B·H, S, D]
        x = bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(x, (B, S, H, D))), [0, 2, 1, 3]))
        return bb.emit(relax.op.reshape(x, (B * H, S, D)))

    def body(bb):
        qh = heads(bb, bb.emit(relax.op.multiply(q, _c(D ** -0.5))))
        kh, vh = heads(bb, k), heads(bb, v)
        s = bb.emit(relax.op.matmul(qh, bb.emit(relax.op.permute_dims(kh, [0, 2, 1]))))
        s = bb.emit(relax.op.reshape(s, (B, H, S, S)))
        add = m if float_mask else bb.emit(relax.op.where(m, _c(0.0), _c(mask_fill)))
        s = bb.emit(relax.op.add(s, add))
        s = bb.emit(relax.op.maximum(_c(floor), s) if floor_first else relax.op.maximum(s, _c(floor)))
        p = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.reshape(s, (B * H, S, S))), axis=-1))
        o = bb.emit(relax.op.reshape(bb.emit(relax.op.matmul(p, vh)), (B, H, S, D)))
        return bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(o, [0, 2, 1, 3])), (B, S, H * D)))

    return build_module([q, k, v, m], body)


def _inputs(mod, seed=0):
    inputs = random_inputs(mod, seed=seed)
    mask = np.ones((B, 1, 1, S), bool)
    mask[1, ..., S - 2:] = False  # row 1 padded
    inputs[3] = mask if inputs[3].dtype == bool else np.where(mask, 0.0, F32_MIN).astype("float32")
    return inputs


@pytest.mark.parametrize("floor_first", [False, True])
def test_clamp_at_the_lowest_float_goes_and_the_attention_fuses(floor_first):
    mod = xglm_attention(floor_first=floor_first)
    out, report = fuse(mod)
    assert report.count("DropLowestClamp") == 1
    assert report.fused["attention"] == 1, report.summary()
    assert fused_calls(out).get("fused_attention") == 1
    expected, actual = run_before_after(mod, out, _inputs(mod))
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_floor_below_lowest_float_is_also_the_identity():
    out, report = fuse(xglm_attention(floor=float("-inf")), DropLowestClamp())
    assert report.count("DropLowestClamp") == 1


def test_a_real_clamp_stays():
    # max(s, -10): scores below -10 change, so the clamp is part of the computation and nothing fuses through it
    mod = xglm_attention(floor=-10.0)
    assert_refused(mod, DropLowestClamp(), reason="above the lowest float32 value: a real clamp")
    out, report = fuse(mod)
    assert report.fused["attention"] == 0
    expected, actual = run_before_after(mod, out, _inputs(mod, seed=1))
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_clamp_over_a_mask_that_may_hold_minus_inf_stays():
    # a float mask input may be -inf: max(-inf, finfo.min) = finfo.min changes a fully masked row
    assert_refused(xglm_attention(float_mask=True), DropLowestClamp(), reason="may hold -inf")


def test_integer_clamp_is_an_expected_refusal_not_a_near_miss():
    # dynamo KV-cache exports (Mistral, Gemma2/3) clamp int64 cache positions with max(x, 0): not this rule's
    # pattern, and nothing a user would fix, so it is listed apart from the near misses
    x = relax.Var("x", relax.TensorType((2, 3), "int64"))
    mod = build_module([x], lambda bb: bb.emit(relax.op.maximum(x, relax.const(0, "int64"))))
    _, report = fuse(mod, DropLowestClamp())
    assert not report.near_misses and len(report.expected_refusals) == 1, report.summary()
