"""OneHot whose inputs are all known at import, feeding Tile's repeats: the legacy exporter's
``repeat_interleave`` (CANINE's molecule upsampling) writes ``Tile(x, Reshape(OneHot([2], 4, [1, r])))`` with
``[1, r]`` read from a shape. Before, the OneHot stayed a run-time op, the Tile an opaque kernel whose output
dims were fresh variables, and a later Pad failed inside TVM. Checked against ONNX Runtime."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.runtime import CompiledModel


def _repeat_interleave_model():
    """``y = Tile(x [2, 1, 1, 8], Reshape(OneHot([2], 4, Shape(r)), [4]))``, ``r`` a [1, 3] input: repeats
    [1, 1, 3, 1], so y is [2, 1, 3, 8]; then a pad of the repeated axis, as CANINE's projection does."""
    nodes = [helper.make_node("Shape", ["r"], ["off_on"], name="off_on"),
             helper.make_node("OneHot", ["index", "depth", "off_on"], ["hot"], name="hot"),
             helper.make_node("Reshape", ["hot", "four"], ["reps"], name="reps"),
             helper.make_node("Tile", ["x", "reps"], ["tiled"], name="tile"),
             helper.make_node("Pad", ["tiled", "pads"], ["y"], name="pad")]
    inits = [numpy_helper.from_array(np.asarray([2], np.int64), "index"),
             numpy_helper.from_array(np.asarray(4, np.int64), "depth"),
             numpy_helper.from_array(np.asarray([4], np.int64), "four"),
             numpy_helper.from_array(np.asarray([0, 0, 1, 0, 0, 0, 2, 0], np.int64), "pads")]
    inputs = [helper.make_tensor_value_info("x", TP.FLOAT, [2, 1, 1, 8]),
              helper.make_tensor_value_info("r", TP.FLOAT, [1, 3])]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_repeats_from_a_constant_one_hot_tile_to_known_dims_and_match_onnx_runtime(run_ort):
    m = _repeat_interleave_model()
    mod = load_onnx(m)
    out_ty = mod["main"].ret_ty
    assert [int(d) for d in out_ty.shape.values] == [2, 1, 6, 8]  # known dims: no fresh variables
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 1, 1, 8)).astype(np.float32),
             "r": np.zeros((1, 3), np.float32)}
    got = CompiledModel.from_module(mod, fuse=False).run(feeds)["y"]
    np.testing.assert_array_equal(got, run_ort(m, feeds)[0])
