"""Pads whose widths are computed from a symbolic dim (``frontend/converters/pad.py``): a sequence padded up to a whole
block, as Longformer's dynamic-axes export does, against ONNX Runtime at lengths that need padding and one that does
not; widths the analyzer cannot sign (a crop, SEW's floor divisions) padded or cropped by their sign at run time; the
other modes refused in one line."""

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


def _to_block_model(mode="constant", crop=False, value=1.5, where="after", width="block"):
    """``pad(x [batch, seq, 4], seq: (8 - seq % 8) % 8)`` with ``value``, ``where`` before or after the tokens: pads
    computed from ``Shape(x)`` (``crop``: the width negated, which ONNX reads as cutting). ``width="sew"``:
    ``seq // 10 - (seq - 10) // 20 * 2 - 1``, SEW's pad back to the input length after its 2× upsampling: 0 or 1
    for every length, which floor divisions hide from the analyzer."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Gather", ["shape", "one"], ["seq"], name="seq", axis=0)]
    if width == "block":
        nodes += [helper.make_node("Mod", ["seq", "block"], ["rem"], name="rem"),
                  helper.make_node("Sub", ["block", "rem"], ["gap"], name="gap"),
                  helper.make_node("Mod", ["gap", "block"], ["width"], name="width")]
    elif width == "ceil":  # ceil(seq / 8.0) · 8 - seq in floats, MobileViT's way of writing a size
        nodes += [helper.make_node("Cast", ["seq"], ["seq_f"], name="seq_f", to=TP.DOUBLE),
                  helper.make_node("Div", ["seq_f", "block_f"], ["blocks_f"], name="blocks_f"),
                  helper.make_node("Ceil", ["blocks_f"], ["blocks_ceil"], name="blocks_ceil"),
                  helper.make_node("Mul", ["blocks_ceil", "block_f"], ["whole_f"], name="whole_f"),
                  helper.make_node("Cast", ["whole_f"], ["whole"], name="whole", to=TP.INT64),
                  helper.make_node("Sub", ["whole", "seq"], ["width"], name="width")]
    else:  # ONNX Div of int64 truncates; seq - 10 may be negative, so floor it as torch's export does
        nodes += [helper.make_node("Div", ["seq", "ten"], ["pooled"], name="pooled"),
                  helper.make_node("Sub", ["seq", "ten"], ["shifted"], name="shifted"),
                  helper.make_node("Cast", ["shifted"], ["shifted_f"], name="shifted_f", to=TP.DOUBLE),
                  helper.make_node("Div", ["shifted_f", "twenty"], ["halves_f"], name="halves_f"),
                  helper.make_node("Floor", ["halves_f"], ["halves_floor"], name="halves_floor"),
                  helper.make_node("Cast", ["halves_floor"], ["halves"], name="halves", to=TP.INT64),
                  helper.make_node("Mul", ["halves", "two"], ["upsampled"], name="upsampled"),
                  helper.make_node("Sub", ["pooled", "upsampled"], ["gap"], name="gap"),
                  helper.make_node("Sub", ["gap", "one"], ["width"], name="width")]
    if crop:
        nodes.append(helper.make_node("Neg", ["width"], ["negw"], name="neg"))
    w = ["zero1", "w1"] if where == "before" else ["w1", "zero1"]
    nodes += [helper.make_node("Unsqueeze", ["negw" if crop else "width", "axis0"], ["w1"], name="w1"),
              helper.make_node("Concat", ["zero1", w[0], "zero1", "zero1", w[1], "zero1"], ["pads"], name="pads",
                               axis=0),
              helper.make_node("Pad", ["x", "pads", "value"], ["y"], name="to_block", mode=mode)]
    inits = [_ints("one", 1), _ints("block", BLOCK), _ints("axis0", [0]), _ints("zero1", [0]), _ints("ten", 10),
             _ints("two", 2), numpy_helper.from_array(np.asarray(20.0, np.float64), "twenty"),
             numpy_helper.from_array(np.asarray(float(BLOCK), np.float64), "block_f"),
             numpy_helper.from_array(np.asarray(value, np.float32), "value")]
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


@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.parametrize("width", ["block", "sew", "ceil"])
@pytest.mark.parametrize("crop", [False, True])
def test_widths_of_unknown_sign_pad_or_crop_at_run_time(run_ort, where, width, crop):
    m = _to_block_model(crop=crop, where=where, width=width)
    model = CompiledModel.from_module(load_onnx(m), fuse=False)
    for batch, seq in ((2, 13), (3, 16), (2, 17), (1, 30), (2, 41)):
        x = np.random.default_rng(seq).standard_normal((batch, seq, 4)).astype(np.float32)
        want = run_ort(m, {"x": x})[0]
        got = model.run({"x": x})["y"]
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_computed_pads_in_another_mode_stay_refused():
    with pytest.raises(ModelLoadError, match=r"node 'to_block' \(op Pad\).*Dynamic pads are not supported"):
        load_onnx(_to_block_model(mode="reflect"))
