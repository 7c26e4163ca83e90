"""Multi-query attention as Falcon's dynamo export writes it: K and V picked from a heads-first view of the fused
QKV projection by ``gather_nd`` with a run-time-normalised negative index (``GatherNDToSlice``), then one K/V
head broadcast over the query heads by the matmuls themselves (no repeat)."""

import numpy as np
import pytest
from tvm import relax

from tvm_fusion_ext.frontend.symbolic_values import Evaluator
from tvm_fusion_ext.testing import build_module, fuse, fused_calls, random_inputs, run_before_after
from tvm_fusion_ext.transform.canonical.gather_nd_slice import GatherNDToSlice
from tvm_fusion_ext.transform.canonicalize import Canonicalize
from tvm_fusion_ext.transform.pipeline import SemanticFusion

B, S, H, D = 2, 6, 4, 8


def _c(v, dtype="int64"):
    return relax.const(np.asarray(v, dtype), dtype)  # relax.const narrows an int64 array to int32 otherwise


def _picked_head(bb, heads_first, index):
    """``heads_first[index]`` the way the exporter writes it: ``where(i < 0, i + Shape(x)[0], i)`` as the index."""
    extent = bb.emit(relax.op.strided_slice(bb.emit(relax.op.shape_to_tensor(bb.emit(relax.op.shape_of(heads_first)))),
                                            [0], [0], [1]))
    i = _c([[index]])
    idx = bb.emit(relax.op.where(relax.op.less(i, _c(0)), relax.op.add(i, extent), i))
    return bb.emit(relax.op.gather_nd(heads_first, idx))


def _mqa_module(index_k=-2, index_v=-1, batch_of_kv=B):
    """qkv [B, S, H+2, D] (H query heads, then K, then V), attention with K/V read from the last two heads."""
    qkv = relax.Var("qkv", relax.TensorType([B, S, H + 2, D], "float32"))

    def body(bb):
        q = bb.emit(relax.op.permute_dims(bb.emit(relax.op.strided_slice(qkv, [2], [0], [H])), [0, 2, 1, 3]))
        heads_first = bb.emit(relax.op.permute_dims(qkv, [2, 0, 1, 3]))  # [H+2, B, S, D]
        k = bb.emit(relax.op.permute_dims(_picked_head(bb, heads_first, index_k), [1, 0, 2, 3]))  # [B, 1, S, D]
        v = bb.emit(relax.op.permute_dims(_picked_head(bb, heads_first, index_v), [1, 0, 2, 3]))
        if batch_of_kv != B:
            k = bb.emit(relax.op.strided_slice(k, [0], [0], [batch_of_kv]))
            v = bb.emit(relax.op.strided_slice(v, [0], [0], [batch_of_kv]))
        scores = bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))))
        p = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.multiply(scores, relax.const(D ** -0.5, "float32"))), -1))
        return bb.emit(relax.op.matmul(p, v))  # [B, H, S, D]

    return build_module([qkv], body)


def test_negative_index_computed_from_the_shape_evaluates_to_a_constant():
    mod = _mqa_module()
    func = mod["main"]
    gathers = [b.value for blk in func.body.blocks for b in blk.bindings
               if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.gather_nd"]
    ev = Evaluator.of_function(func)
    assert [[int(e) for e in ev.elements(g.args[1])] for g in gathers] == [[H], [H + 1]]


def test_single_index_gather_becomes_a_slice_with_the_same_values():
    mod = _mqa_module()
    fused, report = fuse(mod, GatherNDToSlice())
    assert report.canonicalized.get("GatherNDToSlice") == 2, report.canonicalized
    expected, actual = run_before_after(mod, fused, random_inputs(mod, seed=1))
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


def test_gather_with_an_index_from_an_input_stays():
    x = relax.Var("x", relax.TensorType([6, 2, 3], "float32"))
    idx = relax.Var("idx", relax.TensorType([1, 1], "int64"))
    mod = build_module([x, idx], lambda bb: bb.emit(relax.op.gather_nd(x, idx)))
    _, report = fuse(mod, GatherNDToSlice())
    assert not report.canonicalized.get("GatherNDToSlice"), report.canonicalized


def test_gather_of_several_rows_stays():
    x = relax.Var("x", relax.TensorType([6, 2, 3], "float32"))
    mod = build_module([x], lambda bb: bb.emit(relax.op.gather_nd(x, _c([[1], [4]]))))
    _, report = fuse(mod, GatherNDToSlice())
    assert not report.canonicalized.get("GatherNDToSlice"), report.canonicalized


@pytest.mark.parametrize("index_k,index_v", [(-2, -1), (4, 5)])
def test_one_kv_head_broadcast_by_the_matmul_fuses_as_multi_query(index_k, index_v):
    mod = _mqa_module(index_k, index_v)
    fused, report = fuse(mod, Canonicalize(), SemanticFusion())
    assert report.fused["attention"] == 1, report.summary()
    assert fused_calls(fused).get("fused_attention") == 1
    expected, actual = run_before_after(mod, fused, random_inputs(mod, seed=2))
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_kv_broadcast_over_the_batch_is_not_multi_query():
    """K/V of batch 1 broadcast over a batch of 2: not one head per query head group; refused, not fused."""
    mod = _mqa_module(batch_of_kv=1)
    fused, report = fuse(mod, Canonicalize(), SemanticFusion())
    assert report.fused["attention"] == 0, report.summary()
    assert "fused_attention" not in fused_calls(fused)
