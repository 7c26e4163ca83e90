"""FuseRMSNorm: the spellings exporters emit fuse to one fused_rmsnorm computing what the unfused graph
computes; near misses (another axis, another tensor, another exponent) are refused with a reason."""

import numpy as np
import pytest
from tvm import relax

from tvm_fusion_ext.testing import assert_refused, build_module, fuse, fused_calls, random_inputs, run_before_after
from tvm_fusion_ext.transform.graph import op_name
from tvm_fusion_ext.transform.rmsnorm import RMSNormRule

RULE = RMSNormRule()
SHAPE = (2, 5, 16)


def _c(v, dtype="float32"):
    return relax.const(np.asarray(v, dtype))


def rmsnorm_module(square="pow", inverse="rsqrt", gamma="right", casts=False, residual=False, axis=-1,
                   other_tensor=False, exponent=2.0, eps=1e-6, reuse_sum=False, gamma_shape=(SHAPE[-1],)):
    dtype = "float16" if casts else "float32"
    params = [relax.Var("a", relax.TensorType(SHAPE, dtype))]
    if residual:
        params.append(relax.Var("b", relax.TensorType(SHAPE, dtype)))
    g = _c(np.random.default_rng(5).standard_normal(gamma_shape), dtype)

    def body(bb):
        x = bb.emit(relax.op.add(params[0], params[1])) if residual else params[0]
        xf = bb.emit(relax.op.astype(x, "float32")) if casts else x
        sq_of = bb.emit(relax.op.multiply(xf, _c(2.0))) if other_tensor else xf
        sq = bb.emit(relax.op.power(sq_of, _c(exponent)) if square == "pow" else relax.op.multiply(sq_of, sq_of))
        var = bb.emit(relax.op.mean(sq, axis=[axis], keepdims=True))
        s = var if eps is None else bb.emit(relax.op.add(var, _c(eps)))
        if inverse == "rsqrt":
            n = bb.emit(relax.op.multiply(xf, bb.emit(relax.op.rsqrt(s))))
        elif inverse == "reciprocal":  # ONNX Sqrt + Reciprocal
            n = bb.emit(relax.op.multiply(xf, bb.emit(relax.op.divide(_c(1.0), bb.emit(relax.op.sqrt(s))))))
        else:
            n = bb.emit(relax.op.divide(xf, bb.emit(relax.op.sqrt(s))))
        if casts:
            n = bb.emit(relax.op.astype(n, dtype))
        if gamma == "right":
            n = bb.emit(relax.op.multiply(n, g))
        elif gamma == "left":
            n = bb.emit(relax.op.multiply(g, n))
        if reuse_sum:
            return relax.Tuple([n, x])
        return n

    return build_module(params, body)


def _assert_fused(mod, rtol=1e-5, residual=False):
    fused, report = fuse(mod, RULE)
    assert report.fused["rmsnorm"] == 1, report.summary()
    assert fused_calls(fused) == {"fused_rmsnorm": 1}
    expected, actual = run_before_after(mod, fused, random_inputs(mod, seed=1))
    np.testing.assert_allclose(np.asarray(actual, "float32"), np.asarray(expected, "float32"), rtol=rtol, atol=rtol)
    assert ("residual" in report.applied[0].detail) == residual
    return fused


@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("inverse", ["rsqrt", "reciprocal", "divide"])
def test_statistics_spellings(square, inverse):
    _assert_fused(rmsnorm_module(square=square, inverse=inverse))


@pytest.mark.parametrize("gamma", ["left", "right", "none"])
def test_gamma_on_either_side_or_absent(gamma):
    _assert_fused(rmsnorm_module(gamma=gamma))


def test_fp32_casts_of_a_float16_model():
    fused = _assert_fused(rmsnorm_module(casts=True), rtol=2e-3)
    # both casts are inside the fused op (statistics in fp32, one rounding to fp16)
    assert not any(op_name(b.value) == "relax.astype" for b in fused["main"].body.blocks[0].bindings)


def test_residual_add_is_absorbed():
    _assert_fused(rmsnorm_module(residual=True), residual=True)


def test_reused_residual_sum_stays_and_the_norm_fuses():
    # pre-norm blocks reuse h = a + b for the next residual: the add stays, the norm reads it
    fused = _assert_fused(rmsnorm_module(residual=True, reuse_sum=True), residual=False)
    assert any(op_name(b.value) == "relax.add" for b in fused["main"].body.blocks[0].bindings)


@pytest.mark.parametrize("eps", [0.0, None])
def test_zero_or_absent_eps(eps):
    # Helium's dynamo export normalises by sqrt(mean(x²)) with no eps at all: the same formula with eps = 0
    mod = rmsnorm_module(eps=eps, inverse="reciprocal")
    _assert_fused(mod)
    assert fuse(mod, RULE)[1].applied[0].detail == "eps=0"


@pytest.mark.parametrize("inverse", ["rsqrt", "reciprocal", "divide"])
def test_weightless_norm_in_every_inverse_spelling(inverse):
    # NanoChat: x · (1 / sqrt(mean(x²) + eps)) with no γ. The product also reads as γ = x times "1 / sqrt(s)"
    # (a mean over another tensor, refused), and that first reading hid the right one
    mod = rmsnorm_module(inverse=inverse, gamma="none")
    fused = _assert_fused(mod)
    inputs = random_inputs(mod, seed=1)
    _, actual = run_before_after(mod, fused, inputs)
    x = inputs[0].astype("float64")
    np.testing.assert_allclose(actual, x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6), rtol=1e-5, atol=1e-6)


def test_weightless_norm_of_a_weightless_norm():
    # NanoChat normalises the normed embeddings again: n2 = n1 · (1 / sqrt(mean(n1²) + eps)) also reads as
    # n1 (a norm) times a γ of shape [B, S, 1]; both norms fuse
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))

    def norm(bb, v):
        s = bb.emit(relax.op.add(bb.emit(relax.op.mean(bb.emit(relax.op.power(v, _c(2.0))), axis=[-1],
                                                       keepdims=True)), _c(1e-6)))
        return bb.emit(relax.op.multiply(v, bb.emit(relax.op.divide(_c(1.0), bb.emit(relax.op.sqrt(s))))))

    mod = build_module([x], lambda bb: norm(bb, norm(bb, x)))
    fused, report = fuse(mod, RULE)
    assert report.fused["rmsnorm"] == 2, report.summary()
    assert fused_calls(fused) == {"fused_rmsnorm": 2}
    a = random_inputs(mod, seed=2)
    _, actual = run_before_after(mod, fused, a)
    ref = a[0].astype("float64")
    for _ in range(2):
        ref = ref / np.sqrt((ref * ref).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(actual, ref, rtol=1e-5, atol=1e-6)


def test_gamma_of_shape_1_1_n():
    _assert_fused(rmsnorm_module(gamma_shape=(1, 1, SHAPE[-1])))


@pytest.mark.parametrize("kw,reason", [
    ({"axis": 1}, "not only the last axis"),
    ({"other_tensor": True}, "square of another tensor"),
    ({"exponent": 3.0}, "exponent 3.0, not 2"),
    ({"eps": -1e-3}, "eps is -0.001, negative"),
])
def test_near_misses_are_refused(kw, reason):
    assert_refused(rmsnorm_module(**kw), RULE, reason=reason)


def test_per_row_scale_is_not_gamma():
    # a [S, 1] factor scales rows, not features: the norm fuses without it and the multiply stays
    mod = rmsnorm_module(gamma_shape=(SHAPE[1], 1))
    fused = _assert_fused(mod)
    _, report = fuse(mod, RULE)
    assert any("not one value per feature" in e.detail for e in report.refused)
    assert any(op_name(b.value) == "relax.multiply" for b in fused["main"].body.blocks[0].bindings)


def test_layernorm_is_not_an_rmsnorm():
    # x - mean(x) normalised by its variance: LayerNorm's statistics, not RMSNorm's
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))

    def body(bb):
        d = bb.emit(relax.op.subtract(x, bb.emit(relax.op.mean(x, axis=[-1], keepdims=True))))
        var = bb.emit(relax.op.mean(bb.emit(relax.op.multiply(d, d)), axis=[-1], keepdims=True))
        return bb.emit(relax.op.multiply(x, bb.emit(relax.op.rsqrt(bb.emit(relax.op.add(var, _c(1e-5)))))))

    mod = build_module([x], body)
    out, report = fuse(mod, RULE)
    assert report.fused["rmsnorm"] == 0
    assert any("another tensor" in e.detail for e in report.refused)


def _identity_cast_residual_module(cast_dtype="float32"):
    """The legacy exporter's pre-norm block: ``x32 = Cast(h, float32)`` on an fp32 ``h``, normalised, and the
    same ``x32`` read again by the next residual add."""
    a, b = (relax.Var(n, relax.TensorType(SHAPE, "float32")) for n in "ab")
    g = _c(np.random.default_rng(5).standard_normal(SHAPE[-1]))

    def body(bb):
        h = bb.emit(relax.op.add(a, b))
        x32 = bb.emit(relax.op.astype(h, cast_dtype))
        var = bb.emit(relax.op.mean(bb.emit(relax.op.power(x32, _c(2.0, cast_dtype))), axis=[-1], keepdims=True))
        n = bb.emit(relax.op.multiply(x32, bb.emit(relax.op.rsqrt(bb.emit(relax.op.add(var, _c(1e-6, cast_dtype)))))))
        y = bb.emit(relax.op.multiply(g, bb.emit(relax.op.astype(n, "float32"))))
        return relax.Tuple([y, bb.emit(relax.op.add(bb.emit(relax.op.astype(x32, "float32")), y))])

    return build_module([a, b], body)


def test_identity_cast_reused_by_the_residual_is_looked_through():
    from tvm_fusion_ext.transform.canonicalize import Canonicalize

    mod = _identity_cast_residual_module()
    fused, report = fuse(mod, Canonicalize(), RULE)
    assert report.fused["rmsnorm"] == 1, report.summary()
    assert report.canonicalized.get("DropIdentityCast") == 3, report.canonicalized  # x32 and the two casts back
    assert fused_calls(fused) == {"fused_rmsnorm": 1}
    expected, actual = run_before_after(mod, fused, random_inputs(mod, seed=1))
    for e, g in zip(expected, actual):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_a_real_cast_reused_by_the_residual_is_kept():
    # a float16 round trip rounds x: the residual must read the rounded value, so the cast is no identity; the
    # norm fuses over the rounded value and the cast stays for the residual
    from tvm_fusion_ext.transform.canonicalize import Canonicalize

    mod = _identity_cast_residual_module(cast_dtype="float16")
    fused, report = fuse(mod, Canonicalize(), RULE)
    assert report.canonicalized.get("DropIdentityCast") is None, report.canonicalized
    assert report.fused["rmsnorm"] == 1, report.summary()
    casts = [b.value for b in fused["main"].body.blocks[0].bindings if op_name(b.value) == "relax.astype"]
    assert any(str(c.attrs.dtype) == "float16" for c in casts)
    expected, actual = run_before_after(mod, fused, random_inputs(mod, seed=1))
    for e, g in zip(expected, actual):
        np.testing.assert_allclose(g, e, rtol=2e-3, atol=2e-3)


def _rms_norm_op_module(axes=(-1,), residual=False, casts=False):
    """Relax's own ``rms_norm``: what ONNX's ``RMSNormalization`` (opset 23) imports as (fp32 statistics of a
    float16 model are casts around it)."""
    dtype = "float16" if casts else "float32"
    params = [relax.Var("a", relax.TensorType(SHAPE, dtype))]
    if residual:
        params.append(relax.Var("b", relax.TensorType(SHAPE, dtype)))
    g = _c(np.random.default_rng(5).standard_normal(SHAPE[len(SHAPE) - len(axes):]))

    def body(bb):
        x = bb.emit(relax.op.add(params[0], params[1])) if residual else params[0]
        xf = bb.emit(relax.op.astype(x, "float32")) if casts else x
        y = bb.emit(relax.op.nn.rms_norm(xf, g, list(axes), 1e-5))
        return bb.emit(relax.op.astype(y, dtype)) if casts else y

    return build_module(params, body)


@pytest.mark.parametrize("residual", [False, True])
def test_the_rms_norm_op_itself_fuses(residual):
    _assert_fused(_rms_norm_op_module(residual=residual), residual=residual)


def test_the_rms_norm_op_with_fp32_statistics_of_a_float16_model():
    _assert_fused(_rms_norm_op_module(casts=True), rtol=2e-3)


def test_the_rms_norm_op_over_two_axes_is_refused():
    assert_refused(_rms_norm_op_module(axes=(1, 2)), RULE, reason="not only the last axis")
