"""LayoutChainAsReshape: a chain of Transpose/Reshape that moves no element becomes one reshape (or one
transpose); a chain that does move data is left alone; every case computes what ONNX Runtime computes."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_fusion_ext.compile import fuse
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.runtime import CompiledModel

ort = pytest.importorskip("onnxruntime")
F32 = TensorProto.FLOAT


def _chain_model(shape, steps):
    """x -> Relu -> the layout steps -> Relu (the Relus keep the chain between two real ops)."""
    nodes, inits, prev = [helper.make_node("Relu", ["x"], ["r0"])], [], "r0"
    for i, (op, arg) in enumerate(steps):
        out = f"s{i}"
        if op == "Transpose":
            nodes.append(helper.make_node("Transpose", [prev], [out], perm=list(arg)))
        else:
            inits.append(numpy_helper.from_array(np.array(arg, "int64"), f"shape{i}"))
            nodes.append(helper.make_node("Reshape", [prev, f"shape{i}"], [out]))
        prev = out
    nodes.append(helper.make_node("Relu", [prev], ["y"]))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", F32, list(shape))],
                              [helper.make_tensor_value_info("y", F32, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("shape,steps,fires", [
    # ViT's patch embedding as ConvAsMatmul writes it, then the model's flatten + transpose: the identity
    ((1, 196, 24), [("Transpose", (0, 2, 1)), ("Reshape", (1, 24, 14, 14)), ("Reshape", (1, 24, 196)),
                    ("Transpose", (0, 2, 1))], True),
    ((2, 3, 4, 5), [("Transpose", (0, 3, 1, 2)), ("Transpose", (0, 2, 3, 1))], True),       # ConvNeXt's pair
    ((2, 3, 4, 5), [("Transpose", (0, 2, 1, 3)), ("Transpose", (0, 1, 3, 2))], True),       # two -> one transpose
    ((2, 1, 4, 5), [("Transpose", (1, 0, 2, 3)), ("Reshape", (2, 20))], True),              # a unit axis moved
    ((2, 6, 4), [("Reshape", (2, 2, 3, 4)), ("Transpose", (0, 2, 1, 3))], False),           # a head split: moves data
    ((2, 3, 4), [("Transpose", (0, 2, 1)), ("Reshape", (2, 12))], False),
])
def test_layout_chains(shape, steps, fires):
    model = _chain_model(shape, steps)
    _, report = fuse(load_onnx(model))
    assert bool(report.canonicalized.get("LayoutChainAsReshape")) == fires, report.summary()
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    got = CompiledModel.from_module(load_onnx(model)).run({"x": x})["y"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
