"""Resize to sizes computed from the input's shape (``frontend/converters/vision.py::Resize``): MobileViT resizes its
feature map to ``ceil(h / p) · p`` with ``sizes = Concat(Shape(x)[:2], ...)``, written in floats; under a dynamic batch
those sizes are a run-time tensor, which TVM's converter refused. Checked against ONNX Runtime at two batches; sizes
that would change the channel count, or spatial sizes known only at run time, are refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tvm_fusion_ext.errors import ModelLoadError
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.runtime import CompiledModel

PATCH = 4.0


def _ints(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _resize_to_whole_patches(spatial=(6, 6), channels="kept"):
    """``resize(x [batch, 3, h, w], sizes = [batch, 3, ceil(h / 4) · 4, ceil(w / 4) · 4])``, bilinear; the sizes
    computed from ``Shape(x)`` in doubles as MobileViT's export does. ``channels="doubled"``: the channel entry 6."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Slice", ["shape", "zero1", "two1"], ["lead"], name="lead")]
    for axis in ("h", "w"):
        index = "two" if axis == "h" else "three"
        nodes += [helper.make_node("Gather", ["shape", index], [f"{axis}"], name=f"{axis}", axis=0),
                  helper.make_node("Cast", [axis], [f"{axis}_f"], name=f"{axis}_f", to=TP.DOUBLE),
                  helper.make_node("Div", [f"{axis}_f", "patch"], [f"{axis}_q"], name=f"{axis}_q"),
                  helper.make_node("Ceil", [f"{axis}_q"], [f"{axis}_c"], name=f"{axis}_c"),
                  helper.make_node("Mul", [f"{axis}_c", "patch"], [f"{axis}_n"], name=f"{axis}_n"),
                  helper.make_node("Cast", [f"{axis}_n"], [f"{axis}_i"], name=f"{axis}_i", to=TP.INT64),
                  helper.make_node("Unsqueeze", [f"{axis}_i", "zero1"], [f"{axis}_1"], name=f"{axis}_1")]
    if channels == "doubled":
        nodes.append(helper.make_node("Slice", ["shape", "zero1", "one1"], ["batch1"], name="batch1"))
        lead = ["batch1", "six1"]
    else:
        lead = ["lead"]
    nodes += [helper.make_node("Concat", [*lead, "h_1", "w_1"], ["sizes"], name="sizes", axis=0),
              helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="to_patches", mode="linear",
                               coordinate_transformation_mode="half_pixel")]
    inits = [_ints("zero1", [0]), _ints("one1", [1]), _ints("two1", [2]), _ints("six1", [6]), _ints("two", 2),
             _ints("three", 3), numpy_helper.from_array(np.asarray(PATCH, np.float64), "patch")]
    x = helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 3, *spatial])
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


@pytest.mark.parametrize("spatial", [(6, 6), (5, 9)])
def test_sizes_computed_from_a_dynamic_batch_input_match_onnx_runtime(run_ort, spatial):
    m = _resize_to_whole_patches(spatial)
    model = CompiledModel.from_module(load_onnx(m), fuse=False)
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 3, *spatial)).astype(np.float32)
        want = run_ort(m, {"x": x})[0]
        got = model.run({"x": x})["y"]
        assert got.shape == want.shape == (batch, 3, *(-(-s // 4) * 4 for s in spatial))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_sizes_that_change_the_channels_are_refused_in_one_line():
    with pytest.raises(ModelLoadError, match=r"node 'to_patches'.*changes the batch or channel size"):
        load_onnx(_resize_to_whole_patches(channels="doubled"))


def test_spatial_sizes_known_only_at_run_time_are_refused_in_one_line():
    with pytest.raises(ModelLoadError, match=r"node 'to_patches'.*computed at run time"):
        load_onnx(_resize_to_whole_patches(spatial=("h", "w")))
