"""FuseMatmulBiasActivation: every activation x bias x weight layout, against numpy and the unfused graph."""


import numpy as np
import pytest
from tvm import relax

from tvm_fusion_ext.testing import (assert_refused, build_module, fuse, fused_calls, numpy_activation, random_inputs,
                                    run_before_after, run_relax)
from tvm_fusion_ext.transform import FuseMatmulBiasActivation

RULE = "FuseMatmulBiasActivation"
RELAX_ACT = {
    "relu": relax.op.nn.relu, "gelu": relax.op.nn.gelu, "gelu_tanh": relax.op.nn.gelu_tanh,
    "silu": relax.op.nn.silu, "sigmoid": relax.op.sigmoid, "tanh": relax.op.tanh,
}


def _dense_module(act, bias, transpose_b, x_shape=(2, 5, 12), n=7, bias_first=False, bias_shape=None,
                  extra_user=False):
    k = x_shape[-1]
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    w = relax.Var("w", relax.TensorType((n, k) if transpose_b else (k, n), "float32"))
    params = [x, w]
    if bias:
        b = relax.Var("b", relax.TensorType(bias_shape or (n,), "float32"))
        params.append(b)

    def build(bb):
        wt = bb.emit(relax.op.permute_dims(w, [1, 0])) if transpose_b else w
        y = bb.emit(relax.op.matmul(x, wt))
        mm = y
        if bias:
            y = bb.emit(relax.op.add(b, y) if bias_first else relax.op.add(y, b))
        if act != "none":
            y = bb.emit(RELAX_ACT[act](y))
        if extra_user:
            y = bb.emit(relax.op.add(y, mm))
        return y

    return build_module(params, build)


def _assert_same_results(mod, fused, inputs):
    expected, actual = run_before_after(mod, fused, inputs)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
    return actual


@pytest.mark.parametrize("act", ["none", *RELAX_ACT])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_fuses_every_form(act, bias, transpose_b):
    mod = _dense_module(act, bias, transpose_b)
    fused, report = fuse(mod, FuseMatmulBiasActivation())
    assert report.fused["dense"] == 1
    assert fused_calls(fused) == {"fused_dense": 1}
    script = fused["main"].script()
    assert "R.matmul" not in script and "R.permute_dims" not in script
    inputs = random_inputs(mod, seed=1)
    x, w = inputs[0], inputs[1]
    ref = x @ (w.T if transpose_b else w)
    if bias:
        ref = ref + inputs[2]
    ref = numpy_activation(ref, act)
    out = _assert_same_results(mod, fused, inputs)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_bias_operand_order_and_broadcast_bias_shape():
    mod = _dense_module("gelu", True, False, bias_first=True, bias_shape=(1, 1, 7))
    fused, report = fuse(mod, FuseMatmulBiasActivation())
    assert report.fused["dense"] == 1 and "R.nn.gelu" not in fused["main"].script()
    inputs = random_inputs(mod, seed=2)
    _assert_same_results(mod, fused, inputs)


def test_rank2_input():
    mod = _dense_module("relu", True, True, x_shape=(9, 12))
    fused, report = fuse(mod, FuseMatmulBiasActivation())
    assert report.fused["dense"] == 1
    inputs = random_inputs(mod, seed=3)
    _assert_same_results(mod, fused, inputs)


def test_gemm_transb_from_onnx():
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    from tvm.relax.frontend.onnx import from_onnx

    rng = np.random.default_rng(4)
    w = rng.standard_normal((6, 10)).astype("float32")  # [N, K] with transB=1
    c = rng.standard_normal((6,)).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1), helper.make_node("Relu", ["y"], ["z"])],
        "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 10])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, 6])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod = from_onnx(model)
    fused, report = fuse(mod, FuseMatmulBiasActivation())
    assert report.fused["dense"] == 1
    assert "transposed weight" in report.applied[0].detail
    x = rng.standard_normal((3, 10)).astype("float32")
    ref = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(run_relax(fused, [x]), ref, rtol=1e-5, atol=1e-5)


# -- negative cases: the graph must stay exactly as it was, and the report must say why ------------------

def test_batched_matmul_is_not_a_dense_layer():
    a = relax.Var("a", relax.TensorType((2, 3, 4, 5), "float32"))
    b = relax.Var("b", relax.TensorType((2, 3, 5, 4), "float32"))
    mod = build_module([a, b], lambda bb: relax.op.matmul(a, b))
    assert_refused(mod, FuseMatmulBiasActivation(), rule=RULE, reason="batched matmul")


def test_bias_of_wrong_shape_is_not_folded():
    mod = _dense_module("relu", True, False, bias_shape=(5, 7))  # per-row-and-column, not per-column
    fused, report = fuse(mod, FuseMatmulBiasActivation())
    assert any("not a per-column bias" in e.detail for e in report.refused)
    # only the bare matmul may be fused; the add and relu stay as they were
    script = fused["main"].script()
    assert "R.add" in script and "R.nn.relu" in script
    inputs = random_inputs(mod, seed=5)
    _assert_same_results(mod, fused, inputs)


def test_intermediate_used_outside_is_not_absorbed():
    mod = _dense_module("gelu", True, False, extra_user=True)  # the raw matmul output is read again
    fused, report = fuse(mod, FuseMatmulBiasActivation())
    script = fused["main"].script()
    assert "R.nn.gelu" in script  # epilogue not folded: the matmul result is needed on its own
    assert any("also used by" in e.detail for e in report.refused)
    inputs = random_inputs(mod, seed=6)
    _assert_same_results(mod, fused, inputs)


def test_vector_input_is_not_a_dense_layer():
    x = relax.Var("x", relax.TensorType((5,), "float32"))
    w = relax.Var("w", relax.TensorType((5, 3), "float32"))
    mod = build_module([x, w], lambda bb: relax.op.matmul(x, w))
    assert_refused(mod, FuseMatmulBiasActivation(), rule=RULE, reason="vector")
