"""FuseBiasResidualLayerNorm against numpy and the unfused graph, with refusals."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_fusion_ext.testing import fused_calls, random_inputs, run_relax
from tvm_fusion_ext.transform import FuseBiasResidualLayerNorm, FusionReport

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
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            s = x
            if bias:
                s = bb.emit(relax.op.add(b, x) if bias_first else relax.op.add(x, b))
            s = bb.emit(relax.op.add(r, s) if bias_first else relax.op.add(s, r))
            y = bb.emit(relax.op.nn.layer_norm(s, g, be, axes=list(axes), epsilon=EPS))
            if extra_user:
                y = bb.emit(relax.op.multiply(y, s))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _fuse(mod):
    with FusionReport.collect() as report:
        return FuseBiasResidualLayerNorm()(mod), report


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("bias_first", [True, False])
@pytest.mark.parametrize("shape", [(2, 6, 16), (5, 33), (1, 3, 7)])
def test_fuses_and_matches_numpy(bias, bias_first, shape):
    mod = _module(shape, bias=bias, bias_first=bias_first)
    fused, report = _fuse(mod)
    assert report.fused["layernorm"] == 1
    assert fused_calls(fused) == {"fused_layernorm": 1}
    assert "R.nn.layer_norm" not in fused["main"].script()
    x, r, g, be, *rest = random_inputs(mod, seed=7)
    x = x + 30.0  # rows with a large mean: the two-pass variance must not cancel
    inputs = [x, r, g, be, *rest]
    s = x + r + (rest[0] if bias else 0)
    out = run_relax(fused, inputs)
    np.testing.assert_allclose(out, _ln_ref(s, g, be), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out, run_relax(mod, inputs), rtol=1e-4, atol=1e-4)


def test_embedding_sum_is_residual_form():
    """word + position + type embeddings then LN: the inner full-shape add is the 'x' input."""
    shape = (1, 4, 8)
    a, b, c = (relax.Var(n, relax.TensorType(shape, "float32")) for n in "abc")
    g = relax.Var("g", relax.TensorType((8,), "float32"))
    be = relax.Var("be", relax.TensorType((8,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [a, b, c, g, be]):
        with bb.dataflow():
            s = bb.emit(relax.op.add(bb.emit(relax.op.add(a, b)), c))
            out = bb.emit_output(relax.op.nn.layer_norm(s, g, be, axes=[-1], epsilon=EPS))
        bb.emit_func_output(out)
    mod = bb.get()
    fused, report = _fuse(mod)
    assert report.fused["layernorm"] == 1
    inputs = random_inputs(mod, seed=8)
    np.testing.assert_allclose(run_relax(fused, inputs), _ln_ref(inputs[0] + inputs[1] + inputs[2], *inputs[3:]),
                               rtol=1e-4, atol=1e-4)


def test_not_last_axis_is_refused():
    mod = _module((2, 6, 16), bias=False, axes=(-2, -1))
    fused, report = _fuse(mod)
    tvm.ir.assert_structural_equal(fused, mod)
    assert report.fused["layernorm"] == 0
    assert any("not the last axis" in e.detail for e in report.refused)


def test_broadcast_residual_is_refused():
    mod = _module((2, 6, 16), bias=False, residual_shape=(1, 6, 16))
    fused, report = _fuse(mod)
    tvm.ir.assert_structural_equal(fused, mod)
    assert any("broadcast" in e.detail for e in report.refused)


def test_sum_used_elsewhere_is_refused():
    mod = _module((2, 6, 16), bias=False, extra_user=True)
    fused, report = _fuse(mod)
    tvm.ir.assert_structural_equal(fused, mod)
    assert any("also used by" in e.detail for e in report.refused)
