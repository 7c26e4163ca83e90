"""int8 for the gated dense (compile/precision.py): the SwiGLU/GeGLU gate and up projections quantised as one
``fused_dense_int8`` over their columns side by side, then ``act(gate) * up`` (ops/gated_dense.py
``gate_product``). Numerics against a numpy twin of the quantised computation (the int32 dot products exactly,
the float epilogue to rounding), closeness to the fp32 gated dense, smoothing, a tiny LLaMA end to end."""

import math

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_fusion_ext.compile import compile_model
from tvm_fusion_ext.compile.accuracy import row_cosines
from tvm_fusion_ext.compile.calibration import SMOOTHING_ALPHA, dense_input_ranges, smoothing_factors
from tvm_fusion_ext.compile.precision import LowerPrecision
from tvm_fusion_ext.ops.dense_int8 import quantize_weight
from tvm_fusion_ext.ops.gated_dense import interleave_weights, side_by_side
from tvm_fusion_ext.ops.registry import call_op
from tvm_fusion_ext.testing import fused_calls, numpy_activation, quantize_rows_reference

TARGET = "llvm"


def _gated_module(rows, K, N, act, bias=True, runtime_bias=False, seed=0):
    rng = np.random.default_rng(seed)
    wg, wu = (rng.standard_normal((2, K, N)) / math.sqrt(K)).astype("float32")
    b = rng.standard_normal((N, 2)).astype("float32") if bias else None
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((*rows, K), "float32"))
    params = [x]
    if runtime_bias:
        b_var = relax.Var("b", relax.TensorType((N, 2), "float32"))
        params.append(b_var)
    with bb.function("main", params):
        with bb.dataflow():
            bias_in = b_var if runtime_bias else relax.const(b) if bias else None
            d = bb.emit(call_op(bb, "fused_gated_dense", {"x": x, "w": relax.const(interleave_weights(wg, wu)),
                                                          "bias": bias_in}, {"act": act}))
            out = bb.emit_output(d)
        bb.emit_func_output(out)
    return bb.get(), wg, wu, b


def _run(compiled, *arrays):
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def _twin(x, wg, wu, b, act, smooth=None):
    """The quantised computation in numpy: x (smoothed by 1 / s) quantised per row, [wg | wu] (scaled by s) per
    output column, the integer dot products exactly (float64 holds them), then the epilogue and the gate."""
    w = side_by_side(np.stack([wg, wu], axis=-1))
    if smooth is not None:
        w, x = w * smooth[:, None], x * (np.float32(1) / smooth)
    wq, w_scale, _ = quantize_weight(w)
    xq, x_scale, x_zero = quantize_rows_reference(x)
    y = ((xq - x_zero) @ wq.astype(np.float64)) * x_scale * w_scale.astype(np.float64)
    if b is not None:
        y = y + side_by_side(b)
    N = wg.shape[1]
    return numpy_activation(y[..., :N], act) * y[..., N:]


def _fp32(x, wg, wu, b, act):
    g, u = x.astype(np.float64) @ wg, x.astype(np.float64) @ wu
    if b is not None:
        g, u = g + b[:, 0], u + b[:, 1]
    return numpy_activation(g, act) * u


SEQ = tvm.tirx.Var("seq", "int64")
# K not a multiple of the k-group (2 on AVX2, 4 with VNNI), 2N not a multiple of the panel width (66, 34),
# K = 1 (the whole dot product in the epilogue's tail), symbolic rows run at 1, 3 and 17
SHAPES = [((13,), 37, 40, (13,)), ((2, 3), 24, 33, (2, 3)), ((7,), 1, 17, (7,)),
          ((SEQ,), 45, 33, (1,)), ((SEQ,), 45, 33, (3,)), ((2, SEQ), 64, 48, (2, 17))]


@pytest.mark.parametrize("rows,K,N,run_rows", SHAPES)
@pytest.mark.parametrize("act,bias", [("silu", False), ("gelu", True)])
def test_int8_gated_dense_matches_quantised_reference(rows, K, N, run_rows, act, bias):
    mod, wg, wu, b = _gated_module(rows, K, N, act, bias=bias)
    compiled = compile_model(mod, TARGET, fuse_graph=False, precision="int8")
    assert compiled.precision.converted == {"fused_gated_dense": 1}
    assert not compiled.precision.kept
    x = (np.random.default_rng(2).standard_normal((*run_rows, K)) + 0.3).astype("float32")
    got = _run(compiled, x)
    assert got.shape == (*run_rows, N) and got.dtype == np.float32
    np.testing.assert_allclose(got, _twin(x, wg, wu, b, act), rtol=1e-5, atol=1e-4)
    # and close to the fp32 gated dense: int8 is an approximation, not a different function
    assert row_cosines(got, _fp32(x, wg, wu, b, act)).min() > 0.99


def test_gated_pair_is_one_int8_dense_and_a_gate_product():
    mod, _, _, _ = _gated_module((5,), 24, 40, "silu")
    lowered = LowerPrecision("int8")(mod)
    calls = fused_calls(lowered)
    assert calls.get("fused_dense_int8") == 1 and calls.get("fused_quantize_rows") == 1
    assert "fused_gated_dense" not in calls
    weights = [c.value.numpy() for c in _constants(lowered) if str(c.ty.dtype) == "int8"]
    assert [w.shape for w in weights] == [(24, 80)]  # the gate's 40 columns, then the up projection's
    assert any(gv.name_hint.startswith("gate_product") for gv in lowered.get_global_vars())


@pytest.mark.parametrize("mcpu,instruction,register", [("x86-64-v3", "vpmaddwd", "%ymm"),
                                                      ("znver4", "vpdpbusd", "%zmm")])
def test_the_gated_pair_multiplies_with_the_dot_product_instruction(mcpu, instruction, register):
    """Compiled for each CPU class (run nowhere): the pair's micro-kernel is the int8 dense's instruction."""
    from tvm_fusion_ext.targets import resolve_target

    mod, _, _, _ = _gated_module((2, SEQ), 100, 44, "silu")
    compiled = compile_model(mod, resolve_target(f"llvm:{mcpu}"), fuse_graph=False, precision="int8")
    assert compiled.precision.converted == {"fused_gated_dense": 1}
    asm = compiled.executable.mod.imports[0].inspect_source("asm")
    lines = [line for line in asm.splitlines() if instruction in line.split()]
    assert lines and all(register in line for line in lines), lines[:4]


def test_the_tuner_sees_the_pair_as_an_int8_dense_task():
    """``tune --precision int8`` tunes the pair on the dense template, as every int8 dense; the gate product is a
    light elementwise kernel it leaves to the default schedule."""
    from tvm_fusion_ext.compile.pipeline import prepare
    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.tune.tasks import extract_tasks

    target = resolve_target("llvm")
    mod, _, _, _ = _gated_module((8,), 256, 320, "silu")
    tasks, skipped = extract_tasks(prepare(mod, target, fuse_graph=False, precision="int8")[0], target)
    assert [(t.name.startswith("fused_dense_int8"), t.rule) for t in tasks] == [(True, "tfx.dense")]
    assert any(name.startswith("gate_product") for name, _ in skipped), skipped


def test_run_time_gated_bias_is_laid_out_like_the_weight():
    mod, wg, wu, _ = _gated_module((6,), 20, 24, "silu", runtime_bias=True)
    compiled = compile_model(mod, TARGET, fuse_graph=False, precision="int8")
    assert compiled.precision.converted == {"fused_gated_dense": 1}
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 20)).astype("float32")
    b = rng.standard_normal((24, 2)).astype("float32")
    np.testing.assert_allclose(_run(compiled, x, b), _twin(x, wg, wu, b, "silu"), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("precision,dense,weight", [("int8", "fused_dense_int8", ((80, 24), "int8")),
                                                     ("bf16", "fused_dense", ((24, 80), "bfloat16"))])
def test_cuda_lowers_the_gated_pair_to_one_dense_and_a_gate_product(precision, dense, weight):
    """The CUDA form: int8's weight (2N, K) for the tensor cores (``transpose_b``) and its row quantisation in stock
    kernels; bf16's a (K, 2N) bf16 weight and a bf16 activation. Either way no fp32 gated kernel is left."""
    from tvm_fusion_ext.compile.precision import PrecisionReport

    mod, _, _, _ = _gated_module((5,), 24, 40, "silu")
    report = PrecisionReport(precision)
    lowered = LowerPrecision(precision, report, for_cuda=True)(mod)
    calls = fused_calls(lowered)
    assert calls.get(dense) == 1 and "fused_gated_dense" not in calls and "fused_quantize_rows" not in calls
    assert report.converted == {"fused_gated_dense": 1} and not report.kept
    weights = [(c.value.numpy().shape, str(c.ty.dtype)) for c in _constants(lowered) if len(c.ty.shape) == 2]
    assert weights == [weight]  # the gate's 40 columns, then the up projection's
    assert any(gv.name_hint.startswith("gate_product") for gv in lowered.get_global_vars())


@pytest.mark.parametrize("rows,K,N,run_rows", [((13,), 37, 40, (13,)), ((SEQ,), 45, 33, (3,))])
@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_cuda_form_of_the_gated_pair_computes_the_same_on_the_cpu(precision, rows, K, N, run_rows):
    """The CUDA form's layouts (int8's transposed side-by-side weight and stock quantisation, bf16's bf16 tensors)
    built for this CPU: the quantised (or bf16-rounded) gated dense of the numpy twins."""
    import ml_dtypes

    mod, wg, wu, b = _gated_module(rows, K, N, "silu")
    compiled = compile_model(LowerPrecision(precision, for_cuda=True)(mod), TARGET, fuse_graph=False)
    x = (np.random.default_rng(2).standard_normal((*run_rows, K)) + 0.3).astype("float32")
    got = _run(compiled, x)
    if precision == "int8":
        want = _twin(x, wg, wu, b, "silu")
    else:
        r = lambda a: a.astype(ml_dtypes.bfloat16).astype(np.float64)  # noqa: E731
        want = _fp32(r(x), r(wg), r(wu), b, "silu")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def _constants(mod):
    found = []
    relax.analysis.post_order_visit(mod["main"],
                                    lambda e: found.append(e) if isinstance(e, tvm.ir.GenericConst) else None)
    return found


# -- smoothing: the gate and up share x, so one smoothing vector from the (K, 2N) weight and x's calibrated ranges

SK, SN = 48, 40


def _outlier_activations(seed, seq=9):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, seq, SK)).astype("float32")
    x[..., [3, 17, 40]] *= np.float32(40.0)
    return x


def test_smoothed_int8_gated_dense_matches_its_numpy_twin_and_is_closer_to_fp32():
    mod, wg, wu, b = _gated_module((2, SEQ), SK, SN, "silu")
    calibration = [{"x": _outlier_activations(s)} for s in range(2)]
    ranges = dense_input_ranges(mod, calibration)
    assert len(ranges) == 1  # the pair is one quantised dense: one range per input channel of x
    smoothed = compile_model(mod, TARGET, fuse_graph=False, precision="int8", calibration=calibration)
    plain = compile_model(mod, TARGET, fuse_graph=False, precision="int8")
    assert any("smoothed" in n and "1 of 1" in n for n in smoothed.precision.notes), smoothed.precision.notes

    x = _outlier_activations(7)
    got = _run(smoothed, x)
    x_range = np.max([np.abs(c["x"]).reshape(-1, SK).max(0) for c in calibration], axis=0)
    s = smoothing_factors(x_range, side_by_side(np.stack([wg, wu], axis=-1)), SMOOTHING_ALPHA)
    np.testing.assert_allclose(got, _twin(x, wg, wu, b, "silu", smooth=s), rtol=1e-5, atol=1e-4)

    exact = _fp32(x, wg, wu, b, "silu")
    err_smoothed = np.abs(got - exact).max()
    err_plain = np.abs(_run(plain, x) - exact).max()
    # less than the dense's 0.5: the product of two quantised projections compounds their errors (0.58 here)
    assert err_smoothed < 0.7 * err_plain, (err_smoothed, err_plain)
    assert row_cosines(got, exact).mean() > row_cosines(_run(plain, x), exact).mean()
    assert row_cosines(got, exact).min() > 0.999


# -- a tiny LLaMA (two SwiGLU MLPs) end to end


@pytest.mark.slow   # two symbolic decoder builds (int8 and fp32): minutes of code generation on two cores
def test_tiny_llama_int8_converts_its_gated_mlps_and_keeps_the_contract(tiny_causal_lm):
    ort = pytest.importorskip("onnxruntime")
    from tvm_fusion_ext.runtime import CompiledModel

    int8 = CompiledModel.from_onnx(tiny_causal_lm, target=TARGET, precision="int8")
    fp32 = CompiledModel.from_onnx(tiny_causal_lm, target=TARGET)
    report = int8.compiled.precision
    assert report.converted.get("fused_gated_dense") == 2, report.to_dict()  # one per layer
    assert not any("gated" in k for k in report.kept)
    assert "fused_gated_dense 2" in report.summary()

    layers, kv_heads, head_dim = 2, 2, 16
    rng = np.random.default_rng(0)
    session = ort.InferenceSession(tiny_causal_lm, providers=["CPUExecutionProvider"])
    for batch, past, new in ((1, 7, 1), (2, 0, 5)):
        feeds = {"input_ids": rng.integers(3, 1000, (batch, new)).astype(np.int64),
                 "attention_mask": np.ones((batch, past + new), np.int64),
                 "position_ids": np.tile(np.arange(past, past + new, dtype=np.int64), (batch, 1))}
        for i in range(layers):
            for kv in ("key", "value"):
                feeds[f"past_key_values.{i}.{kv}"] = rng.standard_normal((batch, kv_heads, past, head_dim)) \
                    .astype(np.float32)
        want = session.run(["logits"], feeds)[0]
        got = int8.run(feeds)["logits"]
        np.testing.assert_allclose(fp32.run(feeds)["logits"], want, rtol=1e-4, atol=1e-4)
        assert row_cosines(got, want).min() > 0.99, row_cosines(got, want).min()


# -- bf16 where the target has AVX512_BF16: the same side-by-side form, the dense on vdpbf16ps


def _bf16(a):
    import ml_dtypes

    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


@pytest.mark.parametrize("mcpu", ["znver4", "sapphirerapids"])
def test_bf16_gated_pair_multiplies_with_vdpbf16ps_where_the_target_has_it(mcpu):
    """Compiled for AVX512_BF16 CPUs (run nowhere here)."""
    from tvm_fusion_ext.targets import resolve_target

    mod, _, _, _ = _gated_module((2, SEQ), 101, 44, "gelu")  # K odd, 2N not a panel multiple
    compiled = compile_model(mod, resolve_target(f"llvm:{mcpu}"), fuse_graph=False, precision="bf16")
    assert compiled.precision.converted == {"fused_gated_dense": 1}
    asm = compiled.executable.mod.imports[0].inspect_source("asm")
    lines = [line for line in asm.splitlines() if "vdpbf16ps" in line.split()]
    assert lines and all("%zmm" in line for line in lines), lines[:4]
    assert "avx512bf16" in compiled.precision.features


@pytest.mark.parametrize("rows,K,N,run_rows", [((13,), 37, 40, (13,)), ((SEQ,), 45, 33, (3,))])
def test_bf16_gated_pair_for_a_vdpbf16ps_target_computes_the_bf16_gated_dense(rows, K, N, run_rows):
    """The module the bf16 lowering hands an AVX512_BF16 target (bit patterns, the side-by-side weight), built for
    this host, where the dense widens the same bf16 values: the numerics of the form, not of the instruction
    (which rounds each pair's sum, see schedules/cpu/dot_intrin.py)."""
    from tvm_fusion_ext.targets import resolve_target

    mod, wg, wu, b = _gated_module(rows, K, N, "silu")
    lowered = LowerPrecision("bf16", target=resolve_target("llvm:znver4"))(mod)
    calls = fused_calls(lowered)
    assert calls.get("fused_dense") == 1 and "fused_gated_dense" not in calls
    compiled = compile_model(lowered, TARGET, fuse_graph=False)
    x = np.random.default_rng(3).standard_normal((*run_rows, K)).astype("float32")
    xb = _bf16(x)
    want = numpy_activation(xb @ _bf16(wg) + b[:, 0], "silu") * (xb @ _bf16(wu) + b[:, 1])
    np.testing.assert_allclose(_run(compiled, x), want, rtol=2e-5, atol=2e-5)
