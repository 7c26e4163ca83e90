"""FuseQKVProjection: constant projections of one input → one matmul + split."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_fusion_ext.testing import assert_refused, build_module, fuse, random_inputs, run_before_after, run_relax
from tvm_fusion_ext.transform import FuseMatmulBiasActivation, FuseQKVProjection


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


@pytest.mark.parametrize("bias", [(True, True, True), (False, False, False), (True, False, True)])
@pytest.mark.parametrize("transposed", [False, True])
def test_three_projections_become_one(bias, transposed):
    mod = _module(bias=bias, transposed=transposed)
    fused, report = fuse(mod, FuseQKVProjection(), FuseMatmulBiasActivation())
    assert report.fused["qkv"] == 1
    assert report.fused["dense"] == 1  # one dense reads x once
    script = fused["main"].script()
    assert script.count("R.split") == 1 and "R.matmul" not in script
    inputs = random_inputs(mod, seed=3)
    expected, actual = run_before_after(mod, fused, inputs)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


def test_unequal_widths():
    mod = _module(widths=(16, 8, 4))
    fused, report = fuse(mod, FuseQKVProjection())
    assert report.fused["qkv"] == 1
    inputs = random_inputs(mod, seed=4)
    expected, actual = run_before_after(mod, fused, inputs)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


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
    fused, report = fuse(mod, FuseQKVProjection())
    assert report.fused["qkv"] == 1
    xa = rng.standard_normal((3, 6)).astype("float32")
    for got, w in zip(run_relax(fused, [xa]), ws):
        np.testing.assert_allclose(got, xa @ w, rtol=1e-5, atol=1e-5)


def test_non_constant_weights_are_refused():
    mod = _module(const_weights=False, bias=(False, False, False))
    reasons = assert_refused(mod, FuseQKVProjection(), rule="FuseQKVProjection", reason="not a constant")
    assert len(reasons) == 1  # one near miss per group of projections, not one per projection


def test_bias_add_with_another_reader_of_the_matmul_stays():
    # q's matmul output is read by its bias add and by the function result: the bias cannot be absorbed,
    # the projections still merge and the add stays after q's piece of the split
    rng = np.random.default_rng(5)
    x = relax.Var("x", relax.TensorType((3, 8), "float32"))

    def build(bb):
        q = bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((8, 4)).astype("float32"))))
        qb = bb.emit(relax.op.add(q, relax.const(rng.standard_normal((4,)).astype("float32"))))
        k = bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((8, 4)).astype("float32"))))
        return relax.Tuple([q, qb, k])

    mod = build_module([x], build)
    fused, report = fuse(mod, FuseQKVProjection())
    assert report.fused["qkv"] == 1
    script = fused["main"].script()
    assert script.count("R.add") == 1 and script.count("R.matmul") == 1
    inputs = random_inputs(mod, seed=6)
    for actual, expected in zip(*reversed(run_before_after(mod, fused, inputs))):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_projections_in_different_blocks_are_not_merged():
    # a split's pieces are dataflow variables, visible only in their own block
    rng = np.random.default_rng(7)
    x = relax.Var("x", relax.TensorType((3, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        outs = []
        for _ in range(2):
            with bb.dataflow():
                w = relax.const(rng.standard_normal((8, 4)).astype("float32"))
                outs.append(bb.emit_output(relax.op.matmul(x, w)))
            outs.append(bb.emit(relax.op.negative(outs[-1])))  # a binding between the two dataflow blocks
        bb.emit_func_output(relax.Tuple(outs))
    mod = bb.get()
    assert len(mod["main"].body.blocks) == 4
    fused, report = fuse(mod, FuseQKVProjection())
    assert fused.same_as(mod)  # identity: the pass returned its input
    assert report.fused["qkv"] == 0 and report.refused == []


def test_single_projection_untouched():
    mod = _module(n_proj=1, bias=(True,))
    fused, report = fuse(mod, FuseQKVProjection())
    tvm.ir.assert_structural_equal(fused, mod)
    assert report.fused["qkv"] == 0


def test_scalar_bias_is_not_absorbed():
    # x @ W + c with a one-column W: c has as many elements as a bias but is a broadcast scalar, not a vector
    rng = np.random.default_rng(8)
    x = relax.Var("x", relax.TensorType((3, 8), "float32"))

    def build(bb):
        q = bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((8, 1)).astype("float32"))))
        qc = bb.emit(relax.op.add(q, relax.const(0.5, "float32")))
        k = bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((8, 1)).astype("float32"))))
        return relax.Tuple([qc, k])

    mod = build_module([x], build)
    fused, report = fuse(mod, FuseQKVProjection())
    assert report.fused["qkv"] == 1
    assert fused["main"].script().count("R.add") == 1  # the scalar add stays where it was
    inputs = random_inputs(mod, seed=9)
    for actual, expected in zip(*reversed(run_before_after(mod, fused, inputs))):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)

