"""CheckReshapeSizes: a reshape whose element counts match only for some input sizes (Pegasus-X's dynamic export
views ``[batch, seq]`` as ``[batch, seq // 4, 4]``) is refused in one line where ONNX Runtime refuses, and computes
what ONNX Runtime computes where the sizes fit; provably size-preserving reshapes get no check."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_fusion_ext.errors import InputError
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.runtime import CompiledModel

ort = pytest.importorskip("onnxruntime")


def _blocks_model():
    """x [batch, seq] -> Reshape to [batch, seq / 4, 4] (the target computed from x's shape) -> ReduceSum(-1)."""
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, "int64"), name)  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),       # scalars, as torch exports them
        helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
        helper.make_node("Div", ["seq", "four"], ["blocks"]),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["batch1"]),
        helper.make_node("Unsqueeze", ["blocks", "axes"], ["blocks1"]),
        helper.make_node("Concat", ["batch1", "blocks1", "four1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("ReduceSum", ["r", "last"], ["y"], keepdims=0),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])
    graph = helper.make_graph(nodes, "blocks", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [i64("zero", 0), i64("one", 1), i64("four", 4), i64("four1", [4]), i64("axes", [0]),
                               i64("last", [-1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_reshape_valid_for_some_lengths_is_checked_at_run_time():
    model = _blocks_model()
    compiled = CompiledModel.from_module(load_onnx(model, max_shapes={"x": [4, 64]}))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in [(2, 20), (3, 12), (1, 4)]:
        x = np.random.default_rng(0).standard_normal(shape).astype("float32")
        np.testing.assert_allclose(compiled.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    x = np.ones((3, 13), "float32")
    with pytest.raises(Exception):
        sess.run(None, {"x": x})  # the file itself is invalid there
    with pytest.raises(InputError, match=r"shapes do not fit together.*seq = 13 from 'x' dim 1"):
        compiled.run({"x": x})


def test_size_preserving_reshapes_get_no_check():
    from tvm_fusion_ext.compile.checks.reshape_sizes import CheckReshapeSizes
    from tvm_fusion_ext.models import build_encoder_onnx

    import tvm_ffi

    for mod in (load_onnx(build_encoder_onnx()),  # static: every reshape's counts are numbers
                load_onnx(_blocks_model(), shapes={"x": [2, 8]})):
        assert tvm_ffi.structural_equal(CheckReshapeSizes()(mod), mod)
    checked = CheckReshapeSizes()(load_onnx(_blocks_model(), max_shapes={"x": [4, 64]}))
    assert "match_cast" in checked.script()
