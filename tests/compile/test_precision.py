"""Reduced-precision dense kernels (compile/precision.py, ops/dense_int8.py): numerics of each kernel against a
numpy reference of the same rounding / quantisation, at odd shapes and symbolic rows, the report, refusals."""

import math

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_fusion_ext.compile import build, compile_model
from tvm_fusion_ext.compile.accuracy import compare, row_cosines
from tvm_fusion_ext.compile.calibration import SMOOTHING_ALPHA, dense_input_ranges, smoothing_factors
from tvm_fusion_ext.compile.precision import PRECISIONS, check_precision
from tvm_fusion_ext.errors import InputError
from tvm_fusion_ext.ops.dense_int8 import quantize_weight
from tvm_fusion_ext.ops.gated_dense import interleave_weights
from tvm_fusion_ext.ops.registry import call_op
from tvm_fusion_ext.testing import fused_calls, numpy_activation, quantize_rows_reference

TARGET = "llvm"


def _bf16(a):
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def _dense_module(x_shape, K, N, act, transpose_b=False, bias=True, seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((N, K) if transpose_b else (K, N)) / math.sqrt(K)).astype("float32")
    b = rng.standard_normal(N).astype("float32") if bias else None
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((*x_shape, K), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            inputs = {"x": x, "w": relax.const(w), "bias": relax.const(b) if bias else None}
            d = bb.emit(call_op(bb, "fused_dense", inputs, {"act": act, "transpose_b": transpose_b}))
            out = bb.emit_output(d)
        bb.emit_func_output(out)
    return bb.get(), (w.T if transpose_b else w), b


def _run(compiled, *arrays):
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def _batch_dims(rows_shape):
    """(static shape of the module's rows, the shape of x to run) — "sym" rows: (2, seq) with seq symbolic."""
    if rows_shape == "sym":
        return (2, tvm.tirx.Var("seq", "int64")), (2, 7)
    return rows_shape, rows_shape


SHAPES = [((13,), 37, 40), ((1,), 1, 1), ((7,), 13, 100), ((2, 3), 24, 48), ((4, 5), 129, 17), ("sym", 40, 33),
          ("sym", 64, 48)]


@pytest.mark.parametrize("rows,K,N", SHAPES)
@pytest.mark.parametrize("act", ["none", "gelu"])
def test_bf16_dense_matches_bf16_rounded_reference(rows, K, N, act):
    module_rows, run_rows = _batch_dims(rows)
    mod, w, b = _dense_module(module_rows, K, N, act, transpose_b=(K % 2 == 1))
    compiled = compile_model(mod, TARGET, fuse_graph=False, precision="bf16")
    assert compiled.precision.converted == {"fused_dense": 1}
    x = np.random.default_rng(1).standard_normal((*run_rows, K)).astype("float32")
    got = _run(compiled, x)
    want = numpy_activation(_bf16(x) @ _bf16(w) + b, act)  # products of bf16 values are exact in fp32
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("rows,K,N", SHAPES)
@pytest.mark.parametrize("act", ["none", "relu"])
def test_int8_dense_matches_quantised_reference(rows, K, N, act):
    module_rows, run_rows = _batch_dims(rows)
    mod, w, b = _dense_module(module_rows, K, N, act, transpose_b=(N % 2 == 0), bias=(K != 1))
    compiled = compile_model(mod, TARGET, fuse_graph=False, precision="int8")
    assert compiled.precision.converted == {"fused_dense": 1}
    x = (np.random.default_rng(2).standard_normal((*run_rows, K)) + 0.3).astype("float32")
    got = _run(compiled, x)
    wq, w_scale, _ = quantize_weight(w)
    xq, x_scale, x_zero = quantize_rows_reference(x)
    acc = (xq - x_zero) @ wq.astype(np.float64)  # the integer dot product, exactly
    want = numpy_activation(acc * x_scale * w_scale.astype(np.float64) + (b if b is not None else 0), act)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    # and close to fp32: int8 is an approximation, not a different function
    assert row_cosines(got, numpy_activation(x.astype(np.float64) @ w + (b if b is not None else 0), act)).min() > 0.99


@pytest.mark.parametrize("rows,K,N", [((13,), 37, 40), ((2, 3), 64, 48)])
def test_int8_weight_in_cuda_layout_computes_the_same(rows, K, N):
    # CUDA targets store the int8 weight (N, K) (transpose_b, the tensor-core kernel's layout): the operator must
    # compute exactly what the (K, N) weight does; checked here on the CPU, where it runs
    from tvm_fusion_ext.compile.precision import LowerPrecision

    mod, _, _ = _dense_module(rows, K, N, "gelu")
    x = (np.random.default_rng(3).standard_normal((*rows, K)) + 0.3).astype("float32")
    got = {}
    for for_cuda in (False, True):
        lowered = LowerPrecision("int8", for_cuda=for_cuda)(mod)
        # CPU: one fused row-quantisation kernel; CUDA: the stock ops (run here on the CPU: the same values)
        assert fused_calls(lowered).get("fused_quantize_rows", 0) == (0 if for_cuda else 1)
        weights = [c.value.numpy() for c in _constants(lowered) if str(c.ty.dtype) == "int8"]
        assert [w.shape for w in weights] == [(N, K) if for_cuda else (K, N)]
        got[for_cuda] = _run(compile_model(lowered, TARGET, fuse_graph=False), x)
    np.testing.assert_array_equal(got[True], got[False])


def _constants(mod):
    found = []
    relax.analysis.post_order_visit(mod["main"],
                                    lambda e: found.append(e) if isinstance(e, tvm.ir.GenericConst) else None)
    return found


def test_quantize_weight_is_symmetric_per_channel():
    w = np.array([[1.0, 0.0, -2.0], [-0.5, 0.0, 1.0]], np.float32)
    q, scale, col_sum = quantize_weight(w)
    np.testing.assert_allclose(scale, [1 / 127, 1.0, 2 / 127], rtol=1e-6)
    assert q.dtype == np.int8 and q[0, 0] == 127 and q[0, 2] == -127 and q[1, 2] == 64  # 63.5 rounds to even
    assert q[1, 0] == -64 and (q[:, 1] == 0).all() and list(col_sum) == [63, 0, -63]


def _gated_module(rows, K, N, seed=0):
    rng = np.random.default_rng(seed)
    wg, wu = (rng.standard_normal((2, K, N)) / math.sqrt(K)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((*rows, K), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            d = bb.emit(call_op(bb, "fused_gated_dense", {"x": x, "w": relax.const(interleave_weights(wg, wu))},
                                {"act": "silu"}))
            out = bb.emit_output(d)
        bb.emit_func_output(out)
    return bb.get(), wg, wu


@pytest.mark.parametrize("rows", [(5,), (2, 3), "sym"])
def test_bf16_gated_dense(rows):
    module_rows, run_rows = _batch_dims(rows)
    mod, wg, wu = _gated_module(module_rows, 24, 40)
    compiled = compile_model(mod, TARGET, fuse_graph=False, precision="bf16")
    assert compiled.precision.converted == {"fused_gated_dense": 1}
    x = np.random.default_rng(3).standard_normal((*run_rows, 24)).astype("float32")
    xb = _bf16(x)
    want = numpy_activation(xb @ _bf16(wg), "silu") * (xb @ _bf16(wu))
    np.testing.assert_allclose(_run(compiled, x), want, rtol=2e-5, atol=2e-5)


def test_fp32_is_the_default_and_unchanged():
    mod, w, b = _dense_module((6,), 16, 24, "gelu")
    compiled = compile_model(mod, TARGET, fuse_graph=False)
    assert compiled.precision.precision == "fp32" and compiled.precision_name == "fp32"
    assert compiled.precision.converted == {} and compiled.precision.notes == []
    x = np.random.default_rng(4).standard_normal((6, 16)).astype("float32")
    np.testing.assert_allclose(_run(compiled, x), numpy_activation(x @ w.astype(np.float64) + b, "gelu"),
                               rtol=1e-4, atol=1e-4)


def test_nothing_to_quantise_is_a_note():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.softmax(x)))
        bb.emit_func_output(out)
    compiled = compile_model(bb.get(), TARGET, precision="int8")
    assert compiled.precision.kernels == 0
    assert any("nothing to run in int8" in n for n in compiled.precision.notes)
    assert "nothing to run in int8" in compiled.report.summary()
    assert compiled.report.to_dict()["precision"]["precision"] == "int8"


def test_runtime_weight_stays_fp32():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    w = relax.Var("w", relax.TensorType((8, 16), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(call_op(bb, "fused_dense", {"x": x, "w": w}, {"act": "none"})))
        bb.emit_func_output(out)
    compiled = compile_model(bb.get(), TARGET, fuse_graph=False, precision="bf16")
    assert compiled.precision.converted == {} and compiled.precision.kept == ["fused_dense: a run-time weight"]


def test_weights_are_stored_in_the_precision():
    mod, _, _ = _dense_module((8,), 64, 32, "none")
    dtypes = {p: {str(v.dtype) for _, v in compile_model(mod, TARGET, fuse_graph=False, lift_weights=True,
                                                         precision=p).weights} for p in PRECISIONS}
    assert "float32" in dtypes["fp32"] and "bfloat16" in dtypes["bf16"] and "int8" in dtypes["int8"]
    assert "bfloat16" not in dtypes["fp32"] and "float32" not in {d for d in dtypes["bf16"] if d != "float32"}


def test_build_takes_precision():
    mod, w, b = _dense_module((3,), 16, 8, "none")
    ex = build(mod, TARGET, fuse=False, precision="bf16")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = np.ones((3, 16), np.float32)
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), _bf16(x) @ _bf16(w) + b, rtol=1e-5)


@pytest.mark.parametrize("bad", ["fp16", "int4", ""])
def test_unknown_precision_is_one_line(bad):
    with pytest.raises(InputError, match=r"^unknown precision '.*' \(known: fp32, bf16, int8\)$"):
        check_precision(bad)
    mod, _, _ = _dense_module((3,), 16, 8, "none")
    with pytest.raises(InputError, match="unknown precision"):
        compile_model(mod, TARGET, precision=bad)


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_low_precision_refused_on_other_gpu_kinds_in_one_line(precision):
    # CUDA compiles both (tests/cuda/test_cuda_precision.py); the OpenCL stand-in for GPU schedules does not
    from tvm_fusion_ext.compile.precision import apply_precision
    from tvm_fusion_ext.targets import opencl_emulation_target

    mod, _, _ = _dense_module((3,), 16, 8, "none")
    with pytest.raises(InputError, match=rf"^precision {precision}: implemented for CPU \(llvm\) and CUDA targets "
                                         r"only, not opencl$"):
        apply_precision(mod, precision, opencl_emulation_target())


def test_contract_compare():
    want = [[np.array([[1.0, 0.0], [0.0, 2.0]], np.float32)]]
    good = compare(["y"], [[want[0][0] + 1e-4]], want, "bf16")
    assert good["passed"] and good["outputs"]["y"]["rows"] == 2
    bad = compare(["y"], [[np.array([[1.0, 1.0], [0.0, 2.0]], np.float32)]], want, "bf16")
    assert not bad["passed"] and bad["outputs"]["y"]["min_cosine"] < 0.75
    assert compare(["y"], [[np.zeros((2, 2))]], [[np.zeros((2, 2))]], "int8")["passed"]


@pytest.mark.parametrize("precision", ["bf16", "int8"])
@pytest.mark.parametrize("knobs", [{"i": [1, 2, 4], "k": [2, 32], "unroll": 0}, {"i": [2, 1, 4], "k": [1, 64],
                                                                                  "unroll": 3}])
def test_template_knobs_reach_the_low_precision_kernels(precision, knobs):
    """The dense template (and its tuning knobs) schedules the bf16 and int8 kernels as it does fp32 ones."""
    mod, w, b = _dense_module((8,), 64, 48, "none")
    x = np.random.default_rng(5).standard_normal((8, 64)).astype("float32")
    default = _run(compile_model(mod, TARGET, fuse_graph=False, precision=precision), x)
    tuned = compile_model(mod, TARGET, fuse_graph=False, precision=precision, knobs={"tfx.dense": knobs})
    np.testing.assert_allclose(_run(tuned, x), default, rtol=1e-5, atol=1e-5)


# -- int8's activation smoothing (compile/calibration.py): the calibrated ranges are the channel-wise max |x| each
# dense sees; the smoothed kernel computes quant(x / s) @ quant(s w) exactly as its numpy twin, and on inputs with
# outlier channels it is closer to fp32 than the unsmoothed kernel.

SK, SN = 48, 40


def _smoothing_module(seed=0):
    """x (2, seq, SK) → dense(x, w, b), seq symbolic."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((SK, SN)) / math.sqrt(SK)).astype("float32")
    b = rng.standard_normal(SN).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, tvm.tirx.Var("seq", "int64"), SK), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            d = bb.emit(call_op(bb, "fused_dense", {"x": x, "w": relax.const(w), "bias": relax.const(b)},
                                {"act": "none"}))
            out = bb.emit_output(d)
        bb.emit_func_output(out)
    return bb.get(), w, b


def _outlier_activations(seed, seq=9):
    """Token activations with three outlier channels 40× the rest, as LayerNorm outputs of BERT-style models."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, seq, SK)).astype("float32")
    x[..., [3, 17, 40]] *= np.float32(40.0)
    return x


def test_int8_calibration_ranges_are_the_channel_max_over_samples():
    mod, w, _ = _smoothing_module()
    samples = [{"x": _outlier_activations(s, seq=5 + s)} for s in range(3)]
    ranges = dense_input_ranges(mod, samples)
    assert len(ranges) == 1
    want = np.max([np.abs(s["x"]).reshape(-1, SK).max(0) for s in samples], axis=0)
    np.testing.assert_allclose(next(iter(ranges.values())), want, rtol=0, atol=0)


def test_smoothed_int8_matches_its_numpy_twin_and_is_closer_to_fp32():
    mod, w, b = _smoothing_module()
    calibration = [{"x": _outlier_activations(s)} for s in range(2)]
    smoothed = compile_model(mod, "llvm", fuse_graph=False, precision="int8", calibration=calibration)
    plain = compile_model(mod, "llvm", fuse_graph=False, precision="int8")
    assert any("smoothed" in n for n in smoothed.precision.notes), smoothed.precision.notes
    assert any("smoothing off" in n for n in plain.precision.notes), plain.precision.notes

    x = _outlier_activations(7)
    got = _run(smoothed, x)
    x_range = np.max([np.abs(c["x"]).reshape(-1, SK).max(0) for c in calibration], axis=0)
    s = smoothing_factors(x_range, w, SMOOTHING_ALPHA)
    wq, w_scale, _ = quantize_weight(w * s[:, None])
    xq, x_scale, x_zero = quantize_rows_reference(x * (np.float32(1) / s))
    want = ((xq - x_zero) @ wq.astype(np.float64)) * x_scale * w_scale.astype(np.float64) + b
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)

    exact = x.astype(np.float64) @ w + b
    err_smoothed = np.abs(got - exact).max()
    err_plain = np.abs(_run(plain, x) - exact).max()
    assert err_smoothed < 0.5 * err_plain, (err_smoothed, err_plain)
    assert row_cosines(got.reshape(-1, SN), exact.reshape(-1, SN)).min() > 0.999


def test_int8_smoothing_factors_leave_dead_channels_alone():
    w = np.ones((4, 3), np.float32)
    w[2] = 0
    s = smoothing_factors(np.array([4.0, 0.0, 9.0, 1.0], np.float32), w, 0.5)
    np.testing.assert_allclose(s, [2.0, 1.0, 1.0, 1.0])
    assert (smoothing_factors(None, w) == 1).all()
    assert (smoothing_factors(np.ones(5, np.float32), w) == 1).all()  # ranges of another shape: no smoothing
