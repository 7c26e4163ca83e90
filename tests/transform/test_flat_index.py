"""affine_index / is_flat_row_major: the mask-gather proof of RemovePadding, on hand-built index graphs
(symbolic and constant), including indices that are close to ``b·S + j`` but not it."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_fusion_ext.transform.flat_index import affine_index, is_flat_row_major
from tvm_fusion_ext.transform.graph import FunctionGraph, shape_dims


def _index_graph(build, batch=2, seq=5):
    """A function returning the index tensor ``build(bb, batch, seq)`` computes; its graph and result var."""
    m = relax.Var("m", relax.TensorType((batch, seq), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [m]):
        with bb.dataflow():
            out = bb.emit_output(build(bb, batch, seq))
        bb.emit_func_output(out)
    func = bb.get()["main"]
    graph = FunctionGraph(func)
    return graph, func.body.body


def _rows_and_cols(bb, batch, seq, row_stride=None, offset=0, negative_wrap=False, stride_form="take"):
    rows = bb.emit(relax.op.expand_dims(relax.op.arange(0, batch, 1, "int64"), [1, 2, 3]))
    cols = bb.emit(relax.op.expand_dims(relax.op.arange(0, seq, 1, "int64"), [0, 1, 2]))
    if stride_form == "take":  # one entry of the mask's shape
        stride = bb.emit(relax.op.take(relax.op.shape_to_tensor(relax.ShapeExpr([batch, seq])),
                                       relax.const(np.array([1], "int64")), axis=0))
    elif stride_form == "shape_var":  # the same entry read through a bound shape variable
        shape = bb.emit(relax.ShapeExpr([batch, seq]))
        stride = bb.emit(relax.op.take(relax.op.shape_to_tensor(shape), relax.const(np.array([1], "int64")), axis=0))
    else:  # a one-entry shape as a tensor, [S]: the import of a shape gathered by constant indices
        stride = bb.emit(relax.op.shape_to_tensor(relax.ShapeExpr([seq if stride_form == "one_entry" else batch])))
    if row_stride is not None:
        stride = relax.const(row_stride, "int64")
    idx = bb.emit(relax.op.add(bb.emit(relax.op.multiply(rows, stride)), cols))
    if offset:
        idx = bb.emit(relax.op.add(idx, relax.const(offset, "int64")))
    if negative_wrap:  # ONNX Gather's normalisation of negative indices
        n = relax.const(int(batch * seq) if isinstance(batch, int) else 10**6, "int64")
        idx = bb.emit(relax.op.where(bb.emit(relax.op.less(idx, relax.const(0, "int64"))),
                                     bb.emit(relax.op.add(idx, n)), idx))
    return idx


@pytest.mark.parametrize("symbolic", [False, True])
@pytest.mark.parametrize("negative_wrap", [False, True])
@pytest.mark.parametrize("stride_form", ["take", "shape_var", "one_entry"])
def test_flat_index_of_mask_gather_is_proven(symbolic, negative_wrap, stride_form):
    batch, seq = (tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")) if symbolic else (2, 5)
    graph, idx = _index_graph(lambda bb, b, s: _rows_and_cols(bb, b, s, negative_wrap=negative_wrap,
                                                             stride_form=stride_form), batch, seq)
    assert is_flat_row_major(affine_index(idx, graph), shape_dims(idx), batch, seq)


@pytest.mark.parametrize("variant", [dict(row_stride=4), dict(offset=1), dict(stride_form="one_entry_of_batch")])
def test_other_indices_are_not_the_identity(variant):
    graph, idx = _index_graph(lambda bb, b, s: _rows_and_cols(bb, b, s, **variant))
    assert not is_flat_row_major(affine_index(idx, graph), shape_dims(idx), 2, 5)


def test_constant_index_from_a_static_export():
    exact = (np.arange(2)[:, None] * 5 + np.arange(5)[None, :]).reshape(2, 1, 1, 5).astype("int64")
    swapped = exact.copy()
    swapped[0, 0, 0, [1, 2]] = swapped[0, 0, 0, [2, 1]]
    for value, expected in ((exact, True), (swapped, False)):
        def build(bb, b, s, v=value):
            return bb.emit(relax.op.add(relax.const(v, "int64"), relax.const(0, "int64")))

        graph, idx = _index_graph(build)
        assert is_flat_row_major(affine_index(idx, graph), shape_dims(idx), 2, 5) is expected
