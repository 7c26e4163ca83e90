"""fused_quantize_rows on CPU: compute + template against a numpy twin of ONNX DynamicQuantizeLinear per row, bit
for bit, and against the stock Relax quantisation it replaces (static and run-time rows, smoothing folded in)."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_fusion_ext.compile import compile_model
from tvm_fusion_ext.compile.precision import quantize_rows
from tvm_fusion_ext.ops.registry import call_op, make_prim_func
from tvm_fusion_ext.schedules.cpu.quantize_rows import QuantizeRowsCPU
from tvm_fusion_ext.testing import fused_calls

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def _numpy_quantize_rows(x, smooth=None):
    """ONNX DynamicQuantizeLinear per row, in float32 as the kernels compute it (np.rint: half to even)."""
    x = (x * smooth if smooth is not None else x).astype(np.float32)
    lo = np.minimum(x.min(-1, keepdims=True), np.float32(0))
    hi = np.maximum(x.max(-1, keepdims=True), np.float32(0))
    span = (hi - lo) / np.float32(255)
    scale = np.where(span == 0, np.float32(1), span).astype(np.float32)
    zero = np.clip(np.rint(-lo / scale), 0, 255).astype(np.float32)
    q = np.clip(np.rint(x / scale) + zero, 0, 255)
    return q, scale, zero.astype(np.int32)


def _rows(shape, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 0.4).astype(np.float32)
    flat = x.reshape(-1, shape[-1])
    if flat.shape[0] > 1:
        flat[0] = 0.0                          # all zero: scale 1, zero point 0
    if flat.shape[0] > 2:
        flat[1] = np.abs(flat[1])              # no negative value: zero point 0
        flat[2] = -np.abs(flat[2])             # no positive value: zero point 255
    if flat.shape[0] > 3 and shape[-1] >= 4:
        flat[3] = 0.0                          # range [0, 255]: scale 1, and x / scale lands on halves
        flat[3, :4] = [255.0, 0.5, 1.5, 2.5]   # round half to even: 0, 2, 2
    return x


def _run_kernel(shape, dtype, smooth, knobs=None):
    x = _rows(shape, seed=len(shape) + shape[-1])
    K = shape[-1]
    inputs = {"x": x}
    if smooth:
        inputs["smooth"] = (np.random.default_rng(5).uniform(0.25, 4.0, K)).astype(np.float32)
    ty = lambda a: relax.TensorType(list(a.shape), "float32")  # noqa: E731
    func = make_prim_func("fused_quantize_rows", {k: ty(v) for k, v in inputs.items()}, {"dtype": dtype})
    rule = QuantizeRowsCPU(knobs)
    sch = rule.apply(func.with_attr("global_symbol", "main"), TARGET, False)
    assert sch is not None
    lib = tvm.compile(sch.mod, target=TARGET)
    dev = tvm.cpu()
    rows = shape[:-1]
    outs = [tvm.runtime.tensor(np.zeros(shape, dtype), dev), tvm.runtime.tensor(np.zeros((*rows, 1), "float32"), dev),
            tvm.runtime.tensor(np.zeros((*rows, 1), "int32"), dev)]
    lib(*[tvm.runtime.tensor(v, dev) for v in inputs.values()], *outs)
    return [o.numpy() for o in outs], _numpy_quantize_rows(x, inputs.get("smooth")), sch.mod["main"].script()


@pytest.mark.parametrize("dtype", ["uint8", "int16"])
@pytest.mark.parametrize("smooth", [False, True])
@pytest.mark.parametrize("shape", [(6, 384), (1, 16, 64), (5, 13), (2, 5, 100), (1, 1), (3, 4, 8)])
def test_kernel_matches_numpy_bit_for_bit(shape, dtype, smooth):
    (q, scale, zero), (want_q, want_scale, want_zero), _ = _run_kernel(shape, dtype, smooth)
    np.testing.assert_array_equal(scale, want_scale)
    np.testing.assert_array_equal(zero, want_zero)
    np.testing.assert_array_equal(q, want_q.astype(dtype))


def test_halves_round_to_even_and_edge_rows():
    (q, scale, zero), _, _ = _run_kernel((6, 384), "uint8", False)
    assert (scale[0, 0], zero[0, 0]) == (1.0, 0) and not q[0].any()     # all-zero row
    assert zero[1, 0] == 0 and zero[2, 0] == 255                         # one-signed rows
    assert scale[3, 0] == 1.0 and list(q[3, :4]) == [255, 0, 2, 2]       # 0.5, 1.5, 2.5 → 0, 2, 2


def test_template_vectorises_the_row_and_parallelises_rows():
    _, _, script = _run_kernel((4, 64), "int16", True)
    assert "T.parallel" in script
    assert script.count("T.vectorized") >= 4  # row input, both range reductions, q


@pytest.mark.parametrize("unroll", [0, 2])
def test_explicit_knobs(unroll):
    (q, _, _), (want_q, _, _), _ = _run_kernel((8, 48), "uint8", False, knobs={"unroll": unroll})
    np.testing.assert_array_equal(q, want_q.astype("uint8"))


def test_unknown_dtype_and_vector_input_are_refused():
    ty = relax.TensorType([4, 8], "float32")
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        make_prim_func("fused_quantize_rows", {"x": ty}, {"dtype": "int8"})
    with pytest.raises(ValueError, match="needs a row axis"):
        make_prim_func("fused_quantize_rows", {"x": relax.TensorType([8], "float32")}, {"dtype": "uint8"})


def _both_ways_module(rows, K, dtype, smooth):
    """A Relax function returning the fused kernel's (q, scale, zero) and the stock ops' (q, scale, zero)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((*rows, K), "float32"))
    s = relax.const(smooth) if smooth is not None else None
    with bb.function("main", [x]):
        with bb.dataflow():
            fused = quantize_rows(bb, x, dtype, smooth=s, fused=True)
            stock = quantize_rows(bb, x, dtype, smooth=s, fused=False)
            out = bb.emit_output(relax.Tuple([*fused, *stock]))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("dtype", ["uint8", "int16"])
@pytest.mark.parametrize("smooth", [False, True])
def test_same_values_as_the_stock_quantisation_with_run_time_rows(dtype, smooth):
    K = 72
    seq = tvm.tirx.Var("seq", "int64")
    factors = np.random.default_rng(9).uniform(0.25, 4.0, K).astype(np.float32) if smooth else None
    mod = _both_ways_module((2, seq), K, dtype, factors)
    assert fused_calls(mod) == {"fused_quantize_rows": 1}
    compiled = compile_model(mod, TARGET, fuse_graph=False)
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    for n in (1, 7, 33):
        out = [o.numpy() for o in vm["main"](tvm.runtime.tensor(_rows((2, n, K), seed=n)))]
        for fused, stock in zip(out[:3], out[3:]):
            assert fused.dtype == stock.dtype and fused.shape == stock.shape
            np.testing.assert_array_equal(fused, stock)


def _quantize_rows_module(rows, K, dtype):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, K), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.Tuple(list(quantize_rows(bb, x, dtype, fused=True))))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("dtype", ["uint8", "int16"])
def test_run_time_rows_run_serial_when_few_and_match_the_numpy_twin(dtype, monkeypatch):
    """Every build guards the row quantisation's parallel row loop (a decode step's single row stays on the calling
    thread); both branches give the numpy twin's values, bit for bit, a few rows (serial) or many (parallel)."""
    from tvm_fusion_ext.compile.codegen.serial_when_small import MIN_PARALLEL_WORK, SerialWhenSmall, \
        serial_when_small_rules
    from tvm_fusion_ext.compile.pipeline import prepare
    from tvm_fusion_ext.compile.schedule import schedule
    from tvm_fusion_ext.testing import quantize_rows_reference
    from tvm_fusion_ext.tir_nodes import collect

    monkeypatch.delenv("TFX_SERIAL_WHEN_SMALL", raising=False)
    K = 1024
    mod = _quantize_rows_module(tvm.tirx.Var("n", "int64"), K, dtype)
    guarded = SerialWhenSmall(serial_when_small_rules())(schedule(prepare(mod, TARGET, fuse_graph=False)[0], TARGET))
    kernels = [f for _, f in guarded.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert [("tfx.serial_when_small" in (f.attrs or {})) for f in kernels] == [True]
    kinds = {int(lp.kind) for lp in collect(kernels[0].body, tvm.tirx.For)}
    assert {int(tvm.tirx.ForKind.PARALLEL), int(tvm.tirx.ForKind.SERIAL)} <= kinds

    compiled = compile_model(mod, TARGET, fuse_graph=False)
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    for n in (1, 3, 17, 2 * MIN_PARALLEL_WORK // K):  # 17 rows: serial; 64 rows: the parallel branch
        x = _rows((n, K), seed=n)
        q, scale, zero = (o.numpy() for o in vm["main"](tvm.runtime.tensor(x)))
        want_q, want_scale, want_zero = quantize_rows_reference(x)
        np.testing.assert_array_equal(scale, want_scale.astype(np.float32))
        np.testing.assert_array_equal(zero, want_zero.astype(np.int32))
        np.testing.assert_array_equal(q, want_q.astype(dtype))


@pytest.mark.parametrize("rows", [1, 3, 17])
def test_static_rows_match_the_numpy_twin(rows):
    (q, scale, zero), _, _ = _run_kernel((rows, 1024), "uint8", False)
    from tvm_fusion_ext.testing import quantize_rows_reference

    want_q, want_scale, want_zero = quantize_rows_reference(_rows((rows, 1024), seed=2 + 1024))
    np.testing.assert_array_equal(scale, want_scale.astype(np.float32))
    np.testing.assert_array_equal(zero, want_zero.astype(np.int32))
    np.testing.assert_array_equal(q, want_q.astype("uint8"))
