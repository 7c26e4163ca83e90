"""Canonicalisation of elementwise exporter idioms: erf/tanh GELU, SiLU, decomposed LayerNorm.

Every positive case checks three things: the rule's counter, the canonical op in the IR, and numerics (the
rewritten module against the original one, both compiled by TVM, and both against numpy). Near misses must
leave the module structurally unchanged and be reported as refused with a reason.
"""

import math

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

from tvm_fusion_ext.testing import assert_refused, build_module, fuse, run_before_after
from tvm_fusion_ext.transform.canonical.gelu_erf import ErfGeluToGelu
from tvm_fusion_ext.transform.canonical.gelu_tanh import TanhGeluToGeluTanh
from tvm_fusion_ext.transform.canonical.layernorm_decomposed import DecomposedLayerNormToLayerNorm
from tvm_fusion_ext.transform.canonical.silu import SigmoidMulToSilu

op = relax.op
SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
X_SHAPE = (4, 16)

# ---------------------------------------------------------------------------------------------------
# harness
# ---------------------------------------------------------------------------------------------------


def C(value, dtype="float32"):
    return relax.const(np.asarray(value, dtype=dtype))


def _module(build, shapes=(X_SHAPE,), dtype="float32"):
    """One function ``main(p0, p1, ...)``; ``build(emit, *params)`` returns the (unemitted) result expr.

    Each intermediate is emitted as its own binding, the way the ONNX importer lays graphs out.
    """
    params = [relax.Var(f"p{i}", relax.TensorType(s, dtype)) for i, s in enumerate(shapes)]
    return build_module(params, lambda bb: build(bb.emit, *params))


def _assert_canonicalised(mod, rule, canonical_op, gone_op, arrays, reference, rtol=1e-5, atol=1e-5):
    out, report = fuse(mod, rule)
    assert report.count(rule.name) == 1, report.summary()
    script = out.script()
    assert canonical_op in script
    assert gone_op not in script
    old, new = run_before_after(mod, out, arrays)
    np.testing.assert_allclose(new, old, rtol=rtol, atol=atol)
    np.testing.assert_allclose(new, reference, rtol=rtol, atol=atol)
    return out, report


def _assert_untouched(mod, rule):
    out, report = fuse(mod, rule)
    tvm.ir.assert_structural_equal(out, mod)
    assert report.count(rule.name) == 0


def _sw(a, b, swap):
    return (b, a) if swap else (a, b)


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


_erf = np.vectorize(math.erf)


def gelu_ref(x):
    x = x.astype("float64")
    return 0.5 * x * (1.0 + _erf(x / SQRT2))


def gelu_tanh_ref(x):
    x = x.astype("float64")
    return 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)))


def silu_ref(x):
    x = x.astype("float64")
    return x / (1.0 + np.exp(-x))


def layernorm_ref(x, gamma=None, beta=None, eps=1e-5):
    x = x.astype("float64")
    mu = x.mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    return y * (1.0 if gamma is None else gamma) + (0.0 if beta is None else beta)


def _half_x_f(e, x, f, half, order, swap):
    """0.5 * x * f in one of the three association orders."""
    if order == "(x*f)*0.5":
        return op.multiply(*_sw(e(op.multiply(*_sw(x, f, swap))), half, swap))
    if order == "(x*0.5)*f":
        return op.multiply(*_sw(e(op.multiply(*_sw(x, half, swap))), f, swap))
    assert order == "x*(0.5*f)"
    return op.multiply(*_sw(x, e(op.multiply(*_sw(half, f, swap))), swap))


ORDERS = ("(x*f)*0.5", "(x*0.5)*f", "x*(0.5*f)")

# ---------------------------------------------------------------------------------------------------
# exact (erf) GELU
# ---------------------------------------------------------------------------------------------------


def erf_gelu(arg="div", order="(x*f)*0.5", swap=False, k=None, one=1.0, half=0.5, dtype="float32"):
    if k is None:
        k = SQRT2 if arg == "div" else 1.0 / SQRT2

    def build(e, x):
        t = e(op.divide(x, C(k, dtype))) if arg == "div" else e(op.multiply(*_sw(x, C(k, dtype), swap)))
        f = e(op.add(*_sw(e(op.erf(t)), C(one, dtype), swap)))
        return _half_x_f(e, x, f, C(half, dtype), order, swap)

    return build


@pytest.mark.parametrize("arg", ["div", "mul"])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("swap", [False, True])
def test_erf_gelu_every_spelling(arg, order, swap):
    mod = _module(erf_gelu(arg, order, swap))
    x = _rand(*X_SHAPE)
    _assert_canonicalised(mod, ErfGeluToGelu(), "R.nn.gelu(", "R.erf", [x], gelu_ref(x))


def test_erf_gelu_splat_constants_that_keep_the_shape():
    row = np.full((1, X_SHAPE[1]), 1.0)
    mod = _module(erf_gelu("div", k=row * SQRT2, one=row, half=np.full((X_SHAPE[1],), 0.5)))
    x = _rand(*X_SHAPE)
    _assert_canonicalised(mod, ErfGeluToGelu(), "R.nn.gelu(", "R.erf", [x], gelu_ref(x))


def test_erf_gelu_fp16_constants_within_their_rounding():
    mod = _module(erf_gelu("mul", order="x*(0.5*f)", dtype="float16"), dtype="float16")
    out, report = fuse(mod, ErfGeluToGelu())
    assert report.count("ErfGeluToGelu") == 1
    assert "R.nn.gelu(" in out.script()


@pytest.mark.parametrize("build, reason", [
    (erf_gelu("mul", k=0.7), "erf scale is 0.7"),
    (erf_gelu("div", k=1.4), "erf divisor is 1.4"),
    (erf_gelu("div", k=1.0 / SQRT2), "erf divisor"),  # the multiply constant used as a divisor
    (erf_gelu("div", one=2.0), "constant added to erf is 2"),
    (erf_gelu("div", order="x*(0.5*f)", half=0.6), "outer factor is 0.6"),
    (erf_gelu("div", half=np.linspace(0.5, 0.6, X_SHAPE[1])), "outer factor is not a constant with one value"),
    (erf_gelu("div", half=np.full((2, 1, 1), 0.5)), "broadcasts x"),
], ids=["k0.7", "div1.4", "div-by-inverse", "add2", "half0.6", "non-uniform", "broadcasting"])
def test_erf_gelu_near_misses_are_refused(build, reason):
    assert_refused(_module(build), ErfGeluToGelu(), reason=reason)


def test_erf_gelu_not_rewritten_when_erf_is_used_elsewhere():
    def build(e, x):
        erf = e(op.erf(e(op.divide(x, C(SQRT2)))))
        gelu = e(op.multiply(e(op.multiply(x, e(op.add(erf, C(1.0))))), C(0.5)))
        return op.add(gelu, erf)

    assert_refused(_module(build), ErfGeluToGelu(), reason="is also used by")


def test_erf_gelu_needs_the_same_x_twice():
    def build(e, x, y):
        return op.multiply(e(op.multiply(y, e(op.add(e(op.erf(e(op.divide(x, C(SQRT2))))), C(1.0))))), C(0.5))

    _assert_untouched(_module(build, shapes=(X_SHAPE, X_SHAPE)), ErfGeluToGelu())


def _onnx_erf_gelu_model(order):
    """The two orders torch emits: legacy ``Mul(Mul(x, 1+erf), 0.5)``, dynamo ``Mul(x, Mul(0.5, 1+erf))``."""
    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
             (("sqrt2", SQRT2), ("one", 1.0), ("half", 0.5))]
    nodes = [helper.make_node("Div", ["x", "sqrt2"], ["t"]), helper.make_node("Erf", ["t"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["f"])]
    if order == "legacy":
        nodes += [helper.make_node("Mul", ["x", "f"], ["xf"]), helper.make_node("Mul", ["xf", "half"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["half", "f"], ["hf"]), helper.make_node("Mul", ["x", "hf"], ["y"])]
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("order", ["legacy", "dynamo"])
def test_erf_gelu_from_onnx(order):
    mod = from_onnx(_onnx_erf_gelu_model(order))
    x = _rand(2, 8)
    _assert_canonicalised(mod, ErfGeluToGelu(), "R.nn.gelu(", "R.erf", [x], gelu_ref(x))


# ---------------------------------------------------------------------------------------------------
# tanh GELU
# ---------------------------------------------------------------------------------------------------


def tanh_gelu(cube="pow", order="(x*f)*0.5", swap=False, three=3.0, kappa=0.044715, beta=SQRT_2_OVER_PI,
              one=1.0, half=0.5):
    def build(e, x):
        if cube == "pow":
            x3 = e(op.power(x, C(three)))
        elif cube == "(x*x)*x":
            x3 = e(op.multiply(e(op.multiply(x, x)), x))
        else:
            x3 = e(op.multiply(x, e(op.multiply(x, x))))
        inner = e(op.add(*_sw(x, e(op.multiply(*_sw(C(kappa), x3, swap))), swap)))
        t = e(op.tanh(e(op.multiply(*_sw(inner, C(beta), swap)))))
        f = e(op.add(*_sw(C(one), t, swap)))
        return _half_x_f(e, x, f, C(half), order, swap)

    return build


@pytest.mark.parametrize("cube, order, swap", [
    ("pow", "(x*f)*0.5", False), ("pow", "(x*0.5)*f", True), ("pow", "x*(0.5*f)", False),
    ("(x*x)*x", "(x*f)*0.5", True), ("(x*x)*x", "x*(0.5*f)", False), ("x*(x*x)", "(x*0.5)*f", False),
])
def test_tanh_gelu_every_spelling(cube, order, swap):
    mod = _module(tanh_gelu(cube, order, swap))
    x = _rand(*X_SHAPE)
    _assert_canonicalised(mod, TanhGeluToGeluTanh(), "R.nn.gelu_tanh(", "R.tanh", [x], gelu_tanh_ref(x))


@pytest.mark.parametrize("build, reason", [
    (tanh_gelu(three=2.9), "exponent is 2.9"),
    (tanh_gelu(kappa=0.045), "cubic coefficient is 0.045"),
    (tanh_gelu(cube="(x*x)*x", beta=0.8), "tanh scale is 0.8"),
    (tanh_gelu(one=2.0), "constant added to tanh is 2"),
    (tanh_gelu(order="(x*0.5)*f", half=0.6), "outer factor is 0.6"),
], ids=["pow2.9", "kappa", "beta", "add2", "half0.6"])
def test_tanh_gelu_near_misses_are_refused(build, reason):
    assert_refused(_module(build), TanhGeluToGeluTanh(), reason=reason)


def fast_gelu(kappa=0.044715, one=1.0, beta=0.7978845608, order="(x*0.5)*f"):
    """HF FastGELUActivation: 0.5 * x * (1 + tanh(x * 0.7978845608 * (1 + 0.044715 * x * x)))."""

    def build(e, x):
        quad = e(op.add(C(one), e(op.multiply(e(op.multiply(C(kappa), x)), x))))
        t = e(op.tanh(e(op.multiply(e(op.multiply(x, C(beta))), quad))))
        return _half_x_f(e, x, e(op.add(C(1.0), t)), C(0.5), order, False)

    return build


def test_tanh_gelu_factored_fast_gelu_spelling():
    mod = _module(fast_gelu())
    x = _rand(*X_SHAPE)
    _assert_canonicalised(mod, TanhGeluToGeluTanh(), "R.nn.gelu_tanh(", "R.tanh", [x], gelu_tanh_ref(x))


@pytest.mark.parametrize("build, reason", [
    (fast_gelu(kappa=0.05), "quadratic coefficient is 0.05"),
    (fast_gelu(one=0.5), "constant added to the quadratic term is 0.5"),
    (fast_gelu(beta=0.79), "tanh scale is 0.79"),
], ids=["kappa", "one", "beta"])
def test_fast_gelu_near_misses_are_refused(build, reason):
    assert_refused(_module(build), TanhGeluToGeluTanh(), reason=reason)


def test_tanh_gelu_not_rewritten_when_cube_is_used_elsewhere():
    def build(e, x):
        x3 = e(op.power(x, C(3.0)))
        t = e(op.tanh(e(op.multiply(C(SQRT_2_OVER_PI), e(op.add(x, e(op.multiply(C(0.044715), x3))))))))
        gelu = e(op.multiply(e(op.multiply(x, e(op.add(t, C(1.0))))), C(0.5)))
        return op.subtract(gelu, x3)

    assert_refused(_module(build), TanhGeluToGeluTanh(), reason="is also used by")


# ---------------------------------------------------------------------------------------------------
# SiLU
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("swap", [False, True])
def test_sigmoid_mul_to_silu(swap):
    mod = _module(lambda e, x: op.multiply(*_sw(x, e(op.sigmoid(x)), swap)))
    x = _rand(*X_SHAPE)
    _assert_canonicalised(mod, SigmoidMulToSilu(), "R.nn.silu(", "R.sigmoid", [x], silu_ref(x))


def test_silu_not_for_a_gate_on_another_tensor():
    mod = _module(lambda e, x, y: op.multiply(x, e(op.sigmoid(y))), shapes=(X_SHAPE, X_SHAPE))
    _assert_untouched(mod, SigmoidMulToSilu())


def test_silu_not_rewritten_when_sigmoid_is_used_elsewhere():
    def build(e, x):
        s = e(op.sigmoid(x))
        return op.add(e(op.multiply(x, s)), s)

    assert_refused(_module(build), SigmoidMulToSilu(), reason="is also used by")


# ---------------------------------------------------------------------------------------------------
# decomposed LayerNorm
# ---------------------------------------------------------------------------------------------------

LN_SHAPE = (2, 4, 8)
N = LN_SHAPE[-1]


def decomposed_ln(square="pow", norm="sqrt", affine="params", axis=-1, var_axis=None, exponent=2.0, eps=1e-5,
                  gamma_const=None):
    """Build fn for ``_module``; ``affine``: "params" (gamma, beta are inputs), "const", "gamma", "none"."""

    def build(e, x, *gb):
        mu = e(op.mean(x, axis=[axis], keepdims=True))
        d = e(op.subtract(x, mu))
        sq = e(op.power(d, C(exponent))) if square == "pow" else e(op.multiply(d, d))
        var = e(op.mean(sq, axis=[axis if var_axis is None else var_axis], keepdims=True))
        ve = e(op.add(var, C(eps)))
        y = op.divide(d, e(op.sqrt(ve))) if norm == "sqrt" else op.multiply(d, e(op.rsqrt(ve)))
        if affine == "none":
            return y
        gamma, beta = gb if affine == "params" else (C(gamma_const), C(np.linspace(-1, 1, N)))
        y = op.multiply(e(y), gamma)
        return y if affine == "gamma" else op.add(e(y), beta)

    return build


def _ln_module(build, gamma_shape=(N,)):
    return _module(build, shapes=(LN_SHAPE, gamma_shape, (N,)))


@pytest.mark.parametrize("square, norm, axis", [
    ("pow", "sqrt", -1), ("mul", "sqrt", -1), ("pow", "rsqrt", 2), ("mul", "rsqrt", -1),
])
def test_decomposed_layernorm_with_gamma_beta(square, norm, axis):
    mod = _ln_module(decomposed_ln(square, norm, axis=axis))
    x, g, b = _rand(*LN_SHAPE), _rand(N, seed=1), _rand(N, seed=2)
    _, report = _assert_canonicalised(mod, DecomposedLayerNormToLayerNorm(), "R.nn.layer_norm(", "R.mean",
                                      [x, g, b], layernorm_ref(x, g, b))
    assert report.applied[0].detail == f"affine=gamma+beta, norm={norm}, eps=1e-05"


def test_decomposed_layernorm_without_affine_gets_ones_and_zeros():
    mod = _module(decomposed_ln(affine="none"), shapes=(LN_SHAPE,))
    x = _rand(*LN_SHAPE)
    _assert_canonicalised(mod, DecomposedLayerNormToLayerNorm(), "R.nn.layer_norm(", "R.mean",
                          [x], layernorm_ref(x))


def test_decomposed_layernorm_gamma_only_with_leading_ones():
    gamma = np.linspace(0.5, 2.0, N).reshape(1, 1, N)
    mod = _module(decomposed_ln(affine="gamma", gamma_const=gamma), shapes=(LN_SHAPE,))
    x = _rand(*LN_SHAPE)
    out, _ = _assert_canonicalised(mod, DecomposedLayerNormToLayerNorm(), "R.nn.layer_norm(", "R.mean",
                                   [x], layernorm_ref(x, gamma.reshape(N)))
    assert "R.multiply" not in out.script()


def _onnx_decomposed_ln_model(eps=1e-5):
    """LayerNorm as an opset-14 exporter writes it (no LayerNormalization op before opset 17)."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(eps, np.float32), "eps"),
             numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "beta")]
    nodes = [helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
             helper.make_node("Sub", ["x", "mu"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["d2"]),
             helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["n"]),
             helper.make_node("Mul", ["n", "gamma"], ["ng"]),
             helper.make_node("Add", ["ng", "beta"], ["y"])]
    graph = helper.make_graph(nodes, "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(LN_SHAPE))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(LN_SHAPE))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    return model, {i.name: numpy_helper.to_array(i) for i in inits}


def test_onnx_imported_decomposed_layernorm_is_rewritten():
    model, w = _onnx_decomposed_ln_model()
    mod = from_onnx(model)
    x = _rand(*LN_SHAPE)
    out, report = _assert_canonicalised(mod, DecomposedLayerNormToLayerNorm(), "R.nn.layer_norm(", "R.mean",
                                        [x], layernorm_ref(x, w["gamma"], w["beta"]))
    assert report.refused == []
    assert "affine=gamma+beta" in report.applied[0].detail


@pytest.mark.parametrize("build, reason", [
    (decomposed_ln(axis=1), "mean reduces axes [1]"),
    (decomposed_ln(var_axis=-2), "variance reduces axes [-2]"),
    (decomposed_ln(exponent=3.0), "exponent 3.0, not 2"),
    (decomposed_ln(eps=0.0), "eps is 0, not positive"),
], ids=["mean-axis", "var-axis", "pow3", "eps0"])
def test_decomposed_layernorm_near_misses_are_refused(build, reason):
    assert_refused(_ln_module(build), DecomposedLayerNormToLayerNorm(), reason=reason)


def test_decomposed_layernorm_gamma_of_wrong_shape_keeps_its_multiply():
    """A per-position gamma is no LayerNorm weight: the affine match is refused, only the normalisation
    itself is canonicalised and the original multiply/add stay."""
    mod = _ln_module(decomposed_ln(), gamma_shape=(LN_SHAPE[1], N))
    out, report = fuse(mod, DecomposedLayerNormToLayerNorm())
    assert any("gamma has shape [4, 8], expected [8]" in e.detail for e in report.refused), report.summary()
    assert report.count("DecomposedLayerNormToLayerNorm") == 1
    assert [e.detail for e in report.applied] == ["affine=none, norm=sqrt, eps=1e-05"]
    script = out.script()
    assert "R.nn.layer_norm(" in script and "R.multiply(" in script
    x, g, b = _rand(*LN_SHAPE), _rand(LN_SHAPE[1], N, seed=1), _rand(N, seed=2)
    old, new = run_before_after(mod, out, [x, g, b])
    np.testing.assert_allclose(new, old, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(new, layernorm_ref(x, g, b), rtol=1e-5, atol=1e-5)


def test_decomposed_layernorm_needs_the_same_x_in_mean_and_subtract():
    def build(e, x, y, _):
        d = e(op.subtract(x, e(op.mean(y, axis=[-1], keepdims=True))))
        var = e(op.mean(e(op.power(d, C(2.0))), axis=[-1], keepdims=True))
        return op.divide(d, e(op.sqrt(e(op.add(var, C(1e-5))))))

    _assert_untouched(_module(build, shapes=(LN_SHAPE, LN_SHAPE, (N,))), DecomposedLayerNormToLayerNorm())


def test_decomposed_layernorm_not_rewritten_when_centred_x_is_used_elsewhere():
    def build(e, x, g, b):
        mu = e(op.mean(x, axis=[-1], keepdims=True))
        d = e(op.subtract(x, mu))
        var = e(op.mean(e(op.power(d, C(2.0))), axis=[-1], keepdims=True))
        y = e(op.add(e(op.multiply(e(op.divide(d, e(op.sqrt(e(op.add(var, C(1e-5))))))), g)), b))
        return op.add(y, d)

    assert_refused(_ln_module(build), DecomposedLayerNormToLayerNorm(), reason="is also used by")


def test_decomposed_layernorm_with_symbolic_shape():
    """Unknown feature count: ones/zeros come from the shape at run time; the result keeps its symbolic type."""
    n, k = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("k", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("p0", relax.TensorType((n, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(decomposed_ln(square="mul", affine="none")(bb.emit, x))
        bb.emit_func_output(gv)
    mod = bb.get()
    x = _rand(3, 8)
    out, _ = _assert_canonicalised(mod, DecomposedLayerNormToLayerNorm(), "R.nn.layer_norm(", "R.mean",
                                   [x], layernorm_ref(x))
    assert out["main"].ret_ty.shape[1].same_as(k)


def _instance_norm_model(length, axis_of_variance=None):
    """wav2vec2's GroupNorm (a group per channel) as exported: InstanceNormalization with per-channel scale and bias.
    With ``axis_of_variance`` the variance is written out over another axis (not a normalisation of the rows)."""
    rng = np.random.default_rng(5)
    scale, bias = rng.standard_normal(6).astype("float32"), rng.standard_normal(6).astype("float32")
    inits = [numpy_helper.from_array(scale, "scale"), numpy_helper.from_array(bias, "bias")]
    if axis_of_variance is None:
        nodes = [helper.make_node("InstanceNormalization", ["x", "scale", "bias"], ["y"], epsilon=1e-5)]
    else:  # (x - mean_L(x)) / sqrt(var_C(x) + eps): the mean and the variance reduce different axes
        inits += [numpy_helper.from_array(np.array([1e-5], "float32"), "eps"),
                  numpy_helper.from_array(np.array(2.0, "float32"), "two")]
        nodes = [helper.make_node("ReduceMean", ["x"], ["mu"], axes=[2]),
                 helper.make_node("Sub", ["x", "mu"], ["d"]),
                 helper.make_node("ReduceMean", ["x"], ["mc"], axes=[axis_of_variance]),
                 helper.make_node("Sub", ["x", "mc"], ["dc"]),
                 helper.make_node("Pow", ["dc", "two"], ["sq"]),
                 helper.make_node("ReduceMean", ["sq"], ["var"], axes=[axis_of_variance]),
                 helper.make_node("Add", ["var", "eps"], ["ve"]),
                 helper.make_node("Sqrt", ["ve"], ["sd"]),
                 helper.make_node("Div", ["d", "sd"], ["y"])]
    graph = helper.make_graph(nodes, "instance_norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                     [2, 6, length])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("length", [37, "length"])
def test_instance_norm_is_a_layer_norm_of_each_channels_row(length):
    """TVM imports InstanceNormalization as mean, variance, sqrt and divide over the last axis: a LayerNorm of each
    (sample, channel) row with no affine, then the per-channel scale and bias as elementwise ops."""
    import onnxruntime as ort

    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.runtime import CompiledModel

    model = _instance_norm_model(length)
    mod = load_onnx(model, max_shapes={"x": [2, 6, 512]} if length == "length" else None)
    compiled = CompiledModel.from_module(mod)
    assert compiled.report.canonicalized.get("DecomposedLayerNormToLayerNorm") == 1, compiled.report.summary()
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in ([37] if length == 37 else [37, 5, 128]):
        x = (np.random.default_rng(n).standard_normal((2, 6, n)) * 3 + 1).astype("float32")
        np.testing.assert_allclose(compiled.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_a_variance_over_another_axis_is_no_layer_norm():
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.compile import fuse as fuse_model

    _, report = fuse_model(load_onnx(_instance_norm_model(37, axis_of_variance=1)))
    assert not report.canonicalized.get("DecomposedLayerNormToLayerNorm"), report.summary()
