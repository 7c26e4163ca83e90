"""FuseQKVProjection: constant projections of one input → one matmul + split."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_fusion_ext.testing import random_inputs, run_relax
from tvm_fusion_ext.transform import FuseMatmulBiasActivation, FuseQKVProjection, FusionReport


def _module(n_proj=3, bias=(True, True, True), const_weights=True, transposed=False, widths=(16, 16, 16), k=16,
            extra_matmul_user=False, seed=0):
    rng = np.random.default_rng(seed)
    x = relax.Var("x", relax.TensorType((2, 8, k), "float32"))
    params = [x]
    weight_vars = []
    bb = relax.BlockBuilder()
    if not const_weights:
        weight_vars = [relax.Var(f"w{i}", relax.TensorType((k, widths[i]), "float32")) for i in range(n_proj)]
        params += weight_vars
    with bb.function("main", params):
        with bb.dataflow():
            outs = []
            for i in range(n_proj):
                if const_weights:
                    w = rng.standard_normal((k, widths[i])).astype("float32")
                    w_expr = (bb.emit(relax.op.permute_dims(relax.const(np.ascontiguousarray(w.T)), [1, 0]))
                              if transposed else relax.const(w))
                else:
                    w_expr = weight_vars[i]
                y = bb.emit(relax.op.matmul(x, w_expr))
                if bias[i]:
                    y = bb.emit(relax.op.add(y, relax.const(rng.standard_normal((widths[i],)).astype("float32"))))
                outs.append(y)
            if extra_matmul_user:
                outs.append(bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((k, k)).astype("float32")))))
            total = outs[0]
            for o in outs[1:]:
                total = bb.emit(relax.op.add(total, o) if o.ty.shape[-1] == total.ty.shape[-1]
                                else relax.op.add(total, relax.op.sum(o, axis=[-1], keepdims=True)))
            out = bb.emit_output(total)
        bb.emit_func_output(out)
    return bb.get()


def _fuse(mod, then_dense=False):
    with FusionReport.collect() as report:
        out = FuseQKVProjection()(mod)
        if then_dense:
            out = FuseMatmulBiasActivation()(out)
    return out, report


@pytest.mark.parametrize("bias", [(True, True, True), (False, False, False), (True, False, True)])
@pytest.mark.parametrize("transposed", [False, True])
def test_three_projections_become_one(bias, transposed):
    mod = _module(bias=bias, transposed=transposed)
    fused, report = _fuse(mod, then_dense=True)
    assert report.fused["qkv"] == 1
    assert report.fused["dense"] == 1  # one dense reads x once
    script = fused["main"].script()
    assert script.count("R.split") == 1 and "R.matmul" not in script
    inputs = random_inputs(mod, seed=3)
    np.testing.assert_allclose(run_relax(fused, inputs), run_relax(mod, inputs), rtol=1e-4, atol=1e-4)


def test_unequal_widths():
    mod = _module(widths=(16, 8, 4))
    fused, report = _fuse(mod)
    assert report.fused["qkv"] == 1
    inputs = random_inputs(mod, seed=4)
    np.testing.assert_allclose(run_relax(fused, inputs), run_relax(mod, inputs), rtol=1e-4, atol=1e-4)


def test_numpy_reference():
    rng = np.random.default_rng(9)
    ws = [rng.standard_normal((6, 4)).astype("float32") for _ in range(3)]
    x = relax.Var("x", relax.TensorType((3, 6), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            q, k, v = (bb.emit(relax.op.matmul(x, relax.const(w))) for w in ws)
            out = bb.emit_output(relax.Tuple([q, k, v]))
        bb.emit_func_output(out)
    mod = bb.get()
    fused, report = _fuse(mod)
    assert report.fused["qkv"] == 1
    xa = rng.standard_normal((3, 6)).astype("float32")
    for got, w in zip(run_relax(fused, [xa]), ws):
        np.testing.assert_allclose(got, xa @ w, rtol=1e-5, atol=1e-5)


def test_non_constant_weights_are_refused():
    mod = _module(const_weights=False, bias=(False, False, False))
    fused, report = _fuse(mod)
    tvm.ir.assert_structural_equal(fused, mod)
    assert report.fused["qkv"] == 0
    assert any("not a constant" in e.detail for e in report.refused)


def test_single_projection_untouched():
    mod = _module(n_proj=1, bias=(True,))
    fused, report = _fuse(mod)
    tvm.ir.assert_structural_equal(fused, mod)
    assert report.fused["qkv"] == 0
