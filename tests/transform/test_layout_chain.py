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


def _chain_model(shape, steps, conv=None):
    """x -> Relu -> the layout steps [-> a depthwise Conv of filter shape ``conv``] -> Relu (the Relus keep the
    chain between two real ops). A dim of ``shape`` may be a name (symbolic); Reshape's 0 keeps a dim."""
    nodes, inits, prev = [helper.make_node("Relu", ["x"], ["r0"])], [], "r0"
    for i, (op, arg) in enumerate(steps):
        out = f"s{i}"
        if op == "Transpose":
            nodes.append(helper.make_node("Transpose", [prev], [out], perm=list(arg)))
        else:
            inits.append(numpy_helper.from_array(np.array(arg, "int64"), f"shape{i}"))
            nodes.append(helper.make_node("Reshape", [prev, f"shape{i}"], [out]))
        prev = out
    if conv is not None:
        inits.append(numpy_helper.from_array(np.random.default_rng(1).standard_normal(conv).astype("float32"), "w"))
        nodes.append(helper.make_node("Conv", [prev, "w"], ["c"], group=conv[0], pads=[1, 1, 1, 1]))
        prev = "c"
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


# A symbolic batch (a dynamic-axes vision export): a chain is decided at two trial batch sizes; a reshape target the
# exporter computed from the batch (0 here) keeps it symbolic. Checked against ONNX Runtime at two batch sizes.
def _check_batches(model, shape):
    compiled = CompiledModel.from_module(load_onnx(model, max_shapes={"x": [4, *shape]}))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, *shape)).astype("float32")
        np.testing.assert_allclose(compiled.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    return compiled.report


@pytest.mark.parametrize("shape,steps,fires", [
    ((49, 8), [("Transpose", (0, 2, 1)), ("Reshape", (0, 8, 7, 7)), ("Reshape", (0, 8, 49)),
               ("Transpose", (0, 2, 1))], True),                                    # ViT-like: the identity
    ((3, 4, 5), [("Transpose", (0, 3, 1, 2)), ("Transpose", (0, 2, 3, 1))], True),  # ConvNeXt's pair
    ((6, 4), [("Reshape", (0, 2, 3, 4)), ("Transpose", (0, 2, 1, 3))], False),      # a head split moves data
    ((3, 4), [("Transpose", (0, 2, 1)), ("Reshape", (0, 12))], False),
])
def test_layout_chains_with_a_symbolic_batch(shape, steps, fires):
    model = _chain_model(["batch", *shape], steps)
    _, report = fuse(load_onnx(model, max_shapes={"x": [4, *shape]}))
    assert bool(report.canonicalized.get("LayoutChainAsReshape")) == fires, report.summary()
    _check_batches(model, shape)


def test_depthwise_taps_over_tokens_of_a_symbolic_batch_run_channels_last():
    # SegFormer's Mix-FFN in a dynamic-batch export: tokens [batch, 20, 6] viewed as a [batch, 6, 4, 5] image
    model = _chain_model(["batch", 20, 6], [("Transpose", (0, 2, 1)), ("Reshape", (0, 6, 4, 5))], conv=(6, 1, 3, 3))
    report = _check_batches(model, (20, 6))
    assert report.canonicalized.get("DepthwiseConvAsTaps") == 1, report.summary()
    script = fuse(load_onnx(model, max_shapes={"x": [4, 20, 6]}))[0].script()
    # the padded copy the taps read is made from the channels-last image [batch, 4, 5, 6], not from [batch, 6, 4, 5]
    assert "def depthwise_tap_source(lv: T.Buffer((batch, T.int64(4), T.int64(5), T.int64(6))" in script, script


def test_trial_sizes_keep_symbolic_dims_apart_and_above_one():
    import tvm

    from tvm_fusion_ext.transform.canonical.layout_chain import TRIALS, at_size

    batch, length = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("length", "int64")
    for trial in TRIALS:
        (dims,) = at_size([[batch, 4, length // 10, length, 16]], trial)
        assert dims[0] != dims[3] and min(dims[0], dims[2], dims[3]) >= 2, dims
    assert at_size([[length]], 0) != at_size([[length]], 1)
    assert at_size([[length // 1000]], 0) == [None]  # a dim that comes out below 2 decides nothing


def _two_chain_model(shape, steps):
    """Two branches x -> Relu -> the same layout steps -> Relu, added: the same chain at the same sizes twice, as
    every layer of a model repeats its own."""
    nodes, inits = [], []
    for branch in ("a", "b"):
        nodes.append(helper.make_node("Relu" if branch == "a" else "Sigmoid", ["x"], [f"{branch}0"]))
        prev = f"{branch}0"
        for i, (op, arg) in enumerate(steps):
            out = f"{branch}s{i}"
            if op == "Transpose":
                nodes.append(helper.make_node("Transpose", [prev], [out], perm=list(arg)))
            else:
                inits.append(numpy_helper.from_array(np.array(arg, "int64"), f"{branch}shape{i}"))
                nodes.append(helper.make_node("Reshape", [prev, f"{branch}shape{i}"], [out]))
            prev = out
        nodes.append(helper.make_node("Relu", [prev], [f"{branch}y"]))
    nodes.append(helper.make_node("Add", ["ay", "by"], ["y"]))
    graph = helper.make_graph(nodes, "chains", [helper.make_tensor_value_info("x", F32, list(shape))],
                              [helper.make_tensor_value_info("y", F32, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_repeated_chain_is_decided_once():
    # the check runs the chain on an arange of the source's size (ten million elements for a decoder's hidden
    # states at the trial sizes): the same chain at the same sizes in every layer is decided once
    from tvm_fusion_ext.transform.canonical.layout_chain import _plan_of_shapes

    shape, steps = (2, 3, 4, 5), [("Transpose", (0, 3, 1, 2)), ("Transpose", (0, 2, 3, 1))]
    model = _two_chain_model(shape, steps)
    _plan_of_shapes.cache_clear()
    _, report = fuse(load_onnx(model))
    assert report.canonicalized.get("LayoutChainAsReshape") == 2, report.summary()
    info = _plan_of_shapes.cache_info()
    assert info.misses == 1 and info.hits >= 1, info
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    got = CompiledModel.from_module(load_onnx(model)).run({"x": x})["y"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("source,ops,shapes,plan", [
    ((2, 3, 4, 5), (("permute", (0, 3, 1, 2)), ("permute", (0, 2, 3, 1))), ((2, 5, 3, 4), (2, 3, 4, 5)),
     ("reshape", (2, 3, 4, 5))),
    ((2, 3, 4, 5), (("permute", (0, 2, 1, 3)), ("permute", (0, 1, 3, 2))), ((2, 4, 3, 5), (2, 4, 5, 3)),
     ("permute", (0, 2, 3, 1))),
    ((2, 6, 4), (("reshape",), ("permute", (0, 2, 1, 3))), ((2, 2, 3, 4), (2, 3, 2, 4)), None),
    ((2, 3), (("permute", None),), ((3, 2),), ("permute", (1, 0))),
    ((2, 3), (("reshape",),), ((4, 2),), None),  # sizes that do not hold
])
def test_plan_of_shapes_against_numpy(source, ops, shapes, plan):
    # what each plan claims, checked on numpy with an arange the plan never saw
    from tvm_fusion_ext.transform.canonical.layout_chain import _plan_of_shapes

    got = _plan_of_shapes(source, ops, shapes)
    assert got == plan
    if plan is None:
        return
    a = np.arange(int(np.prod(source)), dtype=np.float64).reshape(source) * 1.5
    ref = a
    for op, shape in zip(ops, shapes):
        ref = ref.transpose(list(range(ref.ndim))[::-1] if op[1] is None else list(op[1])) if op[0] == "permute" \
            else ref.reshape(shape)
    out = a.reshape(plan[1]) if plan[0] == "reshape" else a.transpose(plan[1])
    np.testing.assert_array_equal(out, ref)
