"""Attention whose batch and sequence are symbolic (a dynamic-axes export): the head split, the key-padding mask
and the head merge are recognised by meaning with ``batch``/``seq`` as TIR variables, the broadcast mask is
compacted, and the fused graph equals the unfused one at several sizes. Axes that do not line up are refused."""

import numpy as np
import pytest
from tvm import relax, tirx

from tvm_fusion_ext.testing import assert_refused, build_module, fuse, run_before_after
from tvm_fusion_ext.transform import FuseMultiHeadAttention
from tvm_fusion_ext.transform.attention import MultiHeadAttentionRule

H, D = 4, 8
HIDDEN = H * D


def _module(mask_form="legacy", split=(None, None, H, D), perm=(0, 2, 1, 3)):
    """x [batch, seq, H·D] projected to q/k/v by slicing, head split, masked softmax, head merge."""
    batch, seq = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    x = relax.Var("x", relax.TensorType([batch, seq, 3 * HIDDEN], "float32"))
    keep = relax.Var("keep", relax.TensorType([batch, seq], "bool"))

    def build(bb):
        shape = [batch if d is None and n == 0 else seq if d is None else d for n, d in enumerate(split)]

        def heads(n, axes):
            part = bb.emit(relax.op.strided_slice(x, [2], [n * HIDDEN], [(n + 1) * HIDDEN]))
            return bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(part, shape)), axes))

        q, k, v = heads(0, perm), heads(1, (0, 2, 3, 1)), heads(2, perm)
        keys = bb.emit(relax.op.reshape(keep, [batch, 1, 1, seq]))
        if mask_form == "legacy":
            wide = bb.emit(relax.op.broadcast_to(keys, [batch, 1, seq, seq]))
        else:  # dynamo: an all-true [1, 1, seq, 1] and-ed with the keys
            ones = bb.emit(relax.op.broadcast_to(relax.const(True, "bool"), [1, 1, seq, 1]))
            wide = bb.emit(relax.op.logical_and(ones, keys))
        mask = bb.emit(relax.op.where(wide, relax.const(0.0, "float32"), relax.const(-1e9, "float32")))
        s = bb.emit(relax.op.multiply(relax.op.matmul(q, k), relax.const(D ** -0.5, "float32")))
        p = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.add(s, mask)), axis=-1))
        o = bb.emit(relax.op.permute_dims(bb.emit(relax.op.matmul(p, v)), (0, 2, 1, 3)))
        return relax.op.reshape(o, [batch, seq, HIDDEN])

    return build_module([x, keep], build)


def _inputs(batch, seq, seed):
    rng = np.random.default_rng(seed)
    keep = np.ones((batch, seq), bool)
    keep[0, seq // 2 + 1:] = False  # a padded request in the batch
    return [rng.standard_normal((batch, seq, 3 * HIDDEN)).astype("float32"), keep]


@pytest.mark.parametrize("mask_form", ["legacy", "dynamo"])
def test_symbolic_attention_fuses_and_matches(mask_form):
    mod = _module(mask_form)
    fused, report = fuse(mod, FuseMultiHeadAttention())
    assert report.fused["attention"] == 1
    text = fused.script(show_meta=False)
    assert "R.nn.softmax" not in text
    # the key-padding mask reaches the operator as [batch, 1, 1, seq]: no seq x seq tensor is left
    assert "seq, seq" not in text
    for batch, seq in ((1, 1), (2, 9), (3, 17)):
        expected, actual = run_before_after(mod, fused, _inputs(batch, seq, seed=seq))
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_a_reshape_that_cuts_across_tokens_is_refused():
    # [batch, seq, H·D] read as [batch, H, seq, D] is not a head split: the heads would mix tokens
    mod = _module(split=(None, H, None, D), perm=(0, 1, 2, 3))
    # (the walk finds no head-split view of q, so the scores are not q·kᵀ of per-head operands)
    assert_refused(mod, MultiHeadAttentionRule(), rule="FuseMultiHeadAttention", reason="")
