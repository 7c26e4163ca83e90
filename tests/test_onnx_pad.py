"""Pads whose widths are computed from a symbolic dim (``onnx_pad.py``): a sequence padded up to a whole block, as
Longformer's dynamic-axes export does, against ONNX Runtime at lengths that need padding and one that does not;
a width that may be negative (a crop) and the other modes refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tvm_fusion_ext.errors import ModelLoadError
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.runtime import CompiledModel

BLOCK = 8


def _ints(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _to_block_model(mode="constant", crop=False, value=1.5):
    """``pad(x [batch, seq, 4], after seq: (8 - seq % 8) % 8)`` with ``value``: pads computed from ``Shape(x)``
    (``crop``: the width negated, which ONNX reads as cutting)."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Gather", ["shape", "one"], ["seq"], name="seq", axis=0),
             helper.make_node("Mod", ["seq", "block"], ["rem"], name="rem"),
             helper.make_node("Sub", ["block", "rem"], ["gap"], name="gap"),
             helper.make_node("Mod", ["gap", "block"], ["width"], name="width")]
    if crop:
        nodes.append(helper.make_node("Neg", ["width"], ["negw"], name="neg"))
    nodes += [helper.make_node("Unsqueeze", ["negw" if crop else "width", "axis0"], ["w1"], name="w1"),
              helper.make_node("Concat", ["zeros2", "zero1", "zero1", "w1", "zero1"], ["pads"], name="pads", axis=0),
              helper.make_node("Pad", ["x", "pads", "value"], ["y"], name="to_block", mode=mode)]
    inits = [_ints("one", 1), _ints("block", BLOCK), _ints("axis0", [0]), _ints("zeros2", [0, 0]),
             _ints("zero1", [0]), numpy_helper.from_array(np.asarray(value, np.float32), "value")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", "seq", 4])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_pad_to_whole_blocks_computed_from_the_length(run_ort):
    m = _to_block_model()
    model = CompiledModel.from_module(load_onnx(m), fuse=False)
    for batch, seq in ((1, 1), (2, 13), (3, 16), (2, 17)):
        x = np.random.default_rng(seq).standard_normal((batch, seq, 4)).astype(np.float32)
        got = model.run({"x": x})["y"]
        assert got.shape == (batch, -(-seq // BLOCK) * BLOCK, 4)
        np.testing.assert_array_equal(got, run_ort(m, {"x": x})[0])


def test_a_computed_crop_is_refused():
    with pytest.raises(ModelLoadError, match=r"node 'to_block'.*after-pad .* of axis 1 is not shown >= 0 \(a crop\)"):
        load_onnx(_to_block_model(crop=True))


def test_computed_pads_in_another_mode_stay_refused():
    with pytest.raises(ModelLoadError, match=r"node 'to_block' \(op Pad\).*Dynamic pads are not supported"):
        load_onnx(_to_block_model(mode="reflect"))
