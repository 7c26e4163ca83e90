"""Masks broadcast to [B,1,S,T] by exporters reach the fused attention at the size they vary over."""

import numpy as np
import pytest
from tvm import relax

from tvm_fusion_ext.testing import build_module, fuse, random_inputs, run_before_after, tensor_shapes
from tvm_fusion_ext.transform import FuseMultiHeadAttention

B, H, S, T, D = 2, 3, 6, 6, 4


def _module(form):
    q = relax.Var("q", relax.TensorType((B, H, S, D), "float32"))
    k = relax.Var("k", relax.TensorType((B, H, T, D), "float32"))
    v = relax.Var("v", relax.TensorType((B, H, T, D), "float32"))
    keep = relax.Var("keep", relax.TensorType((B, 1, 1, T), "bool"))

    def build(bb):
        if form == "legacy":  # where(broadcast_to(keep), 0, -big), once per layer
            wide = bb.emit(relax.op.broadcast_to(keep, (B, 1, S, T)))
        else:  # dynamo: logical_and(all-true constant [1,1,S,T], keep)
            wide = bb.emit(relax.op.logical_and(relax.const(np.ones((1, 1, S, T), bool)), keep))
        mask = bb.emit(relax.op.where(wide, relax.const(0.0, "float32"), relax.const(-1e9, "float32")))
        s = bb.emit(relax.op.multiply(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2])),
                                      relax.const(0.5, "float32")))
        p = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.add(s, mask)), axis=-1))
        return relax.op.matmul(p, v)

    return build_module([q, k, v, keep], build)


@pytest.mark.parametrize("form", ["legacy", "dynamo"])
def test_broadcast_mask_is_compacted(form):
    mod = _module(form)
    fused, report = fuse(mod, FuseMultiHeadAttention())
    assert report.fused["attention"] == 1
    assert not [sh for sh in tensor_shapes(fused) if sh[-2:] == [S, T]], "an S x T tensor is left"
    inputs = random_inputs(mod, seed=4)
    inputs[3][1, ..., 2:] = False  # padded keys in the second batch
    q, k, v, keep = inputs
    scores = q @ np.swapaxes(k, -1, -2) * 0.5 + np.where(keep, 0.0, -1e9)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v
    expected, actual = run_before_after(mod, fused, inputs)
    np.testing.assert_allclose(actual, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
