"""Reshapes read against the input ranges (``frontend/converters/reshape.py``): a target that keeps the element count
for one size of a dim only (what the legacy exporter writes for ``nn.MultiheadAttention``'s head split, the traced
length baked in beside a dynamic batch) pins that dim; no size at all is refused; a plain head split is left alone.
Numerics against ONNX Runtime at the sizes that fit; refusals by their one-line errors."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tvm_fusion_ext.frontend.dims import bound_reasons, shape_bounds
from tvm_fusion_ext.errors import InputError, ModelLoadError
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.runtime import CompiledModel


def _ints(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _head_split(width: int, traced: int = 20):
    """``y = reshape(x [seq, batch, width], [traced, batch·4, width/4]) · 2``, the leading size a constant and the
    heads computed from ``Shape(x)[1]``, as torch's legacy export of ``nn.MultiheadAttention`` writes it."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Gather", ["shape", "one"], ["batch"], name="batch", axis=0),
             helper.make_node("Mul", ["batch", "heads"], ["rows"], name="rows"),
             helper.make_node("Unsqueeze", ["rows", "axis0"], ["rows1"], name="rows1"),
             helper.make_node("Concat", ["traced", "rows1", "head_dim"], ["target"], name="target", axis=0),
             helper.make_node("Reshape", ["x", "target"], ["split"], name="split_heads"),
             helper.make_node("Mul", ["split", "two"], ["y"], name="twice")]
    inits = [_ints("one", 1), _ints("heads", 4), _ints("axis0", [0]), _ints("traced", [traced]),
             _ints("head_dim", [16]), numpy_helper.from_array(np.asarray(2.0, np.float32), "two")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["seq", "batch", width])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_traced_length_baked_into_a_reshape_pins_that_dim(run_ort):
    m = _head_split(64)
    mod = load_onnx(m)
    assert shape_bounds(mod)["seq"] == (20, 20) and shape_bounds(mod)["batch"] == (1, 512)
    why = bound_reasons(mod)["seq"]
    assert why["upper"] == why["lower"] == ("node 'split_heads' reshapes [seq, batch, 64] to [20, batch * 4, 16], "
                                            "as many elements only when seq = 20 (a size the exporter fixed)")
    model = CompiledModel.from_module(mod, fuse=False)
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((20, batch, 64)).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"], run_ort(m, {"x": x})[0], rtol=1e-6, atol=1e-6)
    # another length: refused before anything runs, saying why (TVM would have read past the input; ONNX Runtime
    # fails on the file there too)
    with pytest.raises(InputError, match=r"dim 0 \(seq\) is 13, outside the range the model was compiled for "
                                         r"\(20\.\.20\): node 'split_heads' reshapes"):
        model.run({"x": np.zeros((13, 2, 64), np.float32)})


def test_a_reshape_no_size_fits_is_refused():
    # seq · 48 = 20 · 4 · 16 has no integer solution
    with pytest.raises(ModelLoadError, match=r"node 'split_heads' reshapes \[seq, batch, 48\] to \[20, batch \* 4, "
                                             r"16\]: no size of seq keeps the element count"):
        load_onnx(_head_split(48))


def test_a_pinned_size_outside_the_given_range_is_refused():
    with pytest.raises(ModelLoadError, match=r"holds only for seq = 20, outside seq's range 1\.\.16"):
        load_onnx(_head_split(64), max_shapes={"x": [16, 4, 64]})


def test_a_head_split_that_holds_at_every_size_narrows_nothing(run_ort):
    # the same split written with the length read from the input: a view at every size
    m = _head_split(64)
    nodes = list(m.graph.node)
    nodes.insert(2, helper.make_node("Gather", ["shape", "zero"], ["seq"], name="seq", axis=0))
    nodes.insert(3, helper.make_node("Unsqueeze", ["seq", "axis0"], ["seq1"], name="seq1"))
    target = next(n for n in nodes if n.name == "target")
    target.input[0] = "seq1"
    m.graph.ClearField("node")
    m.graph.node.extend(nodes)
    m.graph.initializer.append(_ints("zero", 0))
    mod = load_onnx(m)
    assert shape_bounds(mod)["seq"] == (1, 64)  # the leading dim: the batch default
    assert bound_reasons(mod)["seq"] == {"upper": "default for a leading (batch) dim; --max-shape sets one"}
    model = CompiledModel.from_module(mod, fuse=False)
    for seq in (1, 13, 20):
        x = np.random.default_rng(seq).standard_normal((seq, 2, 64)).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"], run_ort(m, {"x": x})[0], rtol=1e-6, atol=1e-6)
