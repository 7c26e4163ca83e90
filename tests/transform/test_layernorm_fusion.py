"""FuseBiasResidualLayerNorm against numpy and the unfused graph, with refusals."""

import numpy as np
import pytest
from tvm import relax

from tvm_fusion_ext.testing import assert_refused, build_module, fuse, fused_calls, random_inputs, run_before_after
from tvm_fusion_ext.transform import FuseBiasResidualLayerNorm

EPS = 1e-5


def _ln_ref(v, g, b, eps=EPS):
    v = v.astype("float64")
    mu = v.mean(-1, keepdims=True)
    var = ((v - mu) ** 2).mean(-1, keepdims=True)
    return (v - mu) / np.sqrt(var + eps) * g + b


def _module(shape=(2, 6, 16), bias=True, bias_first=False, residual_shape=None, axes=(-1,), extra_user=False):
    n = shape[-1]
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    r = relax.Var("r", relax.TensorType(residual_shape or shape, "float32"))
    norm_shape = [shape[a] for a in axes]
    g = relax.Var("g", relax.TensorType(norm_shape, "float32"))
    be = relax.Var("be", relax.TensorType(norm_shape, "float32"))
    params = [x, r, g, be]
    if bias:
        b = relax.Var("b", relax.TensorType((n,), "float32"))
        params.append(b)

    def build(bb):
        s = x
        if bias:
            s = bb.emit(relax.op.add(b, x) if bias_first else relax.op.add(x, b))
        s = bb.emit(relax.op.add(r, s) if bias_first else relax.op.add(s, r))
        y = bb.emit(relax.op.nn.layer_norm(s, g, be, axes=list(axes), epsilon=EPS))
        return bb.emit(relax.op.multiply(y, s)) if extra_user else y

    return build_module(params, build)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("bias_first", [True, False])
@pytest.mark.parametrize("shape", [(2, 6, 16), (5, 33), (1, 3, 7)])
def test_fuses_and_matches_numpy(bias, bias_first, shape):
    mod = _module(shape, bias=bias, bias_first=bias_first)
    fused, report = fuse(mod, FuseBiasResidualLayerNorm())
    assert report.fused["layernorm"] == 1
    assert fused_calls(fused) == {"fused_layernorm": 1}
    assert "R.nn.layer_norm" not in fused["main"].script()
    x, r, g, be, *rest = random_inputs(mod, seed=7)
    x = x + 30.0  # rows with a large mean: the two-pass variance must not cancel
    inputs = [x, r, g, be, *rest]
    s = x + r + (rest[0] if bias else 0)
    expected, out = run_before_after(mod, fused, inputs)
    np.testing.assert_allclose(out, _ln_ref(s, g, be), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_embedding_sum_is_residual_form():
    """word + position + type embeddings then LN: the inner full-shape add is the 'x' input."""
    shape = (1, 4, 8)
    a, b, c = (relax.Var(n, relax.TensorType(shape, "float32")) for n in "abc")
    g = relax.Var("g", relax.TensorType((8,), "float32"))
    be = relax.Var("be", relax.TensorType((8,), "float32"))

    def build(bb):
        s = bb.emit(relax.op.add(bb.emit(relax.op.add(a, b)), c))
        return relax.op.nn.layer_norm(s, g, be, axes=[-1], epsilon=EPS)

    mod = build_module([a, b, c, g, be], build)
    fused, report = fuse(mod, FuseBiasResidualLayerNorm())
    assert report.fused["layernorm"] == 1
    inputs = random_inputs(mod, seed=8)
    _, out = run_before_after(mod, fused, inputs)
    np.testing.assert_allclose(out, _ln_ref(inputs[0] + inputs[1] + inputs[2], *inputs[3:]), rtol=1e-4, atol=1e-4)


def test_normalising_over_more_than_the_last_axis_is_refused():
    mod = _module((2, 6, 16), bias=False, axes=(-2, -1))
    assert_refused(mod, FuseBiasResidualLayerNorm(), rule="FuseBiasResidualLayerNorm", reason="not the last axis")


@pytest.mark.parametrize("kwargs", [
    {"residual_shape": (1, 6, 16)},  # a broadcast residual is a different op
    {"extra_user": True},  # a pre-norm block: the sum feeds the next residual too
], ids=["broadcast-residual", "sum-used-elsewhere"])
def test_residual_that_cannot_be_absorbed_stays_and_only_the_norm_fuses(kwargs):
    mod = _module((2, 6, 16), bias=False, **kwargs)
    fused, report = fuse(mod, FuseBiasResidualLayerNorm())
    assert report.fused["layernorm"] == 1 and fused_calls(fused) == {"fused_layernorm": 1}
    text = fused.script(show_meta=False)
    assert "R.add" in text  # the residual sum is still computed outside the kernel
    (call,) = [b.value for blk in fused["main"].body.blocks for b in blk.bindings
               if isinstance(b.value, relax.Call) and "fused_layernorm" in str(b.value.args[0])]
    assert len(call.args[1].fields) == 3  # x, gamma, beta: no residual input
    inputs = random_inputs(mod, seed=3)
    expected, actual = run_before_after(mod, fused, inputs)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)
