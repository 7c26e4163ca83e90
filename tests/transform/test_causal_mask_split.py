"""A decoder's combined mask as dynamo exports it at a static length: ``where(tril ∧ keep, 0, finfo.min)`` with the
causal pattern folded to an S×S constant. The attention rule splits it: ``causal=True`` (key blocks above the
diagonal skipped) and the key-padding part alone, compacted to [B, 1, 1, S]. A constant that is not causal (a
sliding window) stays a mask. Either way the fused graph equals the unfused one on every query that sees a key."""

import numpy as np
import pytest
from tvm import relax

from tvm_fusion_ext.testing import build_module, fuse, run_before_after, tensor_shapes
from tvm_fusion_ext.transform import FuseMultiHeadAttention

B, S, H, D = 2, 12, 2, 8
NEG = float(np.finfo("float32").min)


def _module(pattern: np.ndarray, keep_first: bool, dtype: str = "float32", neg: float = NEG):
    q, k, v = (relax.Var(n, relax.TensorType([B, H, S, D], dtype)) for n in "qkv")
    keep = relax.Var("keep", relax.TensorType([B, S], "bool"))

    def build(bb):
        keys = bb.emit(relax.op.reshape(keep, [B, 1, 1, S]))
        visible = relax.const(pattern.reshape(1, 1, S, S))
        both = bb.emit(relax.op.logical_and(keys, visible) if keep_first else relax.op.logical_and(visible, keys))
        mask = bb.emit(relax.op.where(both, relax.const(0.0, dtype), relax.const(neg, dtype)))
        scores = bb.emit(relax.op.multiply(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2])),
                                           relax.const(D ** -0.5, dtype)))
        p = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.add(scores, mask)), axis=-1))
        return relax.op.matmul(p, v)

    return build_module([q, k, v, keep], build)


def _inputs(seed=0, dtype="float32"):
    rng = np.random.default_rng(seed)
    keep = np.ones((B, S), bool)
    keep[1, 7:] = False  # right padding in the second sequence
    return [rng.standard_normal((B, H, S, D)).astype(dtype) for _ in range(3)] + [keep]


def _attention_params(fused):
    (call,) = [b.value for blk in fused["main"].body.blocks for b in blk.bindings
               if isinstance(b.value, relax.Call) and "fused_attention" in str(b.value.args[0])]
    func = fused[call.args[0]]
    return str(func.attrs["tfx.params"])


@pytest.mark.parametrize("keep_first", [False, True])
def test_causal_constant_is_split_off(keep_first):
    mod = _module(np.tril(np.ones((S, S), bool)), keep_first)
    fused, report = fuse(mod, FuseMultiHeadAttention())
    assert report.fused["attention"] == 1
    assert '"causal": true' in _attention_params(fused)
    assert not [s for s in tensor_shapes(fused) if s[-2:] == [S, S]], "the S x S mask is still read"
    expected, actual = run_before_after(mod, fused, _inputs())
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_sliding_window_constant_stays_a_mask():
    window = np.tril(np.ones((S, S), bool)) & np.triu(np.ones((S, S), bool), -3)
    mod = _module(window, keep_first=False)
    fused, report = fuse(mod, FuseMultiHeadAttention())
    assert report.fused["attention"] == 1
    assert '"causal": false' in _attention_params(fused)
    expected, actual = run_before_after(mod, fused, _inputs())
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, neg, causal", [
    ("float16", float(np.finfo("float16").min), True),  # fp16's lowest is what exporters write for -inf there
    ("float16", -10000.0, False),  # an ordinary (if large) score: a mask
    ("float32", float(np.finfo("float16").min), False),  # -65504 is an ordinary score in float32
])
def test_float16_lowest_hides_keys(dtype, neg, causal):
    """The operator's softmax runs in float32, where exp(s - 65504 - max) is exactly 0: in a float16 model the
    dtype's lowest hides a key as -inf does, so a float16 decoder's causal mask becomes ``causal=True`` too."""
    mod = _module(np.tril(np.ones((S, S), bool)), keep_first=False, dtype=dtype, neg=neg)
    fused, report = fuse(mod, FuseMultiHeadAttention())
    assert report.fused["attention"] == 1
    assert f'"causal": {str(causal).lower()}' in _attention_params(fused)
    expected, actual = run_before_after(mod, fused, _inputs(dtype=dtype))
    valid = np.ones(expected.shape, bool)
    valid[1, :, 7:] = False  # padded queries of the second sequence: unspecified when neg is finite
    tol = 2e-3 if dtype == "float16" else 1e-5
    np.testing.assert_allclose(actual[valid].astype("float32"), expected[valid].astype("float32"), rtol=tol, atol=tol)
