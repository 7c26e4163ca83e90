"""The bf16 dot-product micro-kernel (schedules/cpu/dot_intrin.py: ``vdpbf16ps`` on k-pairs × 16 columns) on its
own: a dense over bf16 weights packed in k-pair panels (the ``dot_panels`` layout of ops/dense_int8.py with
group 2), scheduled here as the CPU template schedules the int8 one. Numerics of the loop nest against numpy on
this host (its non-tensorized form), the instruction in the assembly for AVX512_BF16 CPUs (compiled here, run
only where the host has it), and the target-feature choice."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import s_tir, te

from tvm_fusion_ext.deploy import host
from tvm_fusion_ext.ops.dense_int8 import pack_dot_panels
from tvm_fusion_ext.schedules.cpu.dot_intrin import (
    AVX512_BF16,
    IMPORT_LLVM_KEY,
    bf16_bits_to_float,
    bf16_dot_kernel,
    dpbf16ps_wrapper,
    register,
)
from tvm_fusion_ext.targets import resolve_target

FLAGS = host.cpu_flags() or set()
HAS_BF16 = host.machine_arch() == "x86_64" and "avx512_bf16" in FLAGS


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def _dense(M, K, N, nr=16):
    """x (M, 2·ceil(K/2)) bf16 bits (zero past K), w dot_panels (N/nr, K/2, nr, 2) bf16 bits → fp32 (M, N/nr·nr)."""
    kg = -(-K // 2)
    x = te.placeholder((M, kg * 2), "uint16", name="x")
    w = te.placeholder((-(-N // nr), kg, nr, 2), "uint16", name="w")
    g = te.reduce_axis((0, kg), name="kg")
    kk = te.reduce_axis((0, 2), name="kk")
    out = te.compute((M, -(-N // nr) * nr), lambda i, j: te.sum(
        bf16_bits_to_float(x[i, g * 2 + kk]) * bf16_bits_to_float(w[j // nr, g, j % nr, kk]), axis=[g, kk]),
        name="dense")
    return te.create_prim_func([x, w, out])


def _schedule(func, tensorize: bool, mr=4, nr=16):
    sch = s_tir.Schedule(func)
    block = sch.get_sblock("dense")
    i, j, g, kk = sch.get_loops(block)
    i0, i1 = sch.split(i, [None, mr])
    j0, j1 = sch.split(j, [None, nr])
    sch.reorder(j0, i0, g, i1, j1, kk)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, i0, preserve_unit_loops=True)
    sch.parallel(j0)
    sch.unroll(i1)
    j1v, j1l = sch.split(j1, [None, AVX512_BF16.lanes])
    sch.unroll(j1v)
    init = sch.decompose_reduction(block, g)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.vectorize(sch.get_loops(acc)[-1])
    if tensorize:
        sch.tensorize(j1l, register(AVX512_BF16))
        sch.annotate(j0, IMPORT_LLVM_KEY, dpbf16ps_wrapper(AVX512_BF16))
    return sch.mod["main"]


def _inputs(M, K, N, nr=16, seed=0):
    rng = np.random.default_rng(seed)
    xf = rng.standard_normal((M, K)).astype(np.float32)
    wf = rng.standard_normal((K, N)).astype(np.float32)
    kg = -(-K // 2)
    x = np.zeros((M, kg * 2), np.uint16)
    x[:, :K] = _bits(xf)
    w = pack_dot_panels(_bits(wf), nr, 2)
    ref = xf.astype(ml_dtypes.bfloat16).astype(np.float64) @ wf.astype(ml_dtypes.bfloat16).astype(np.float64)
    return x, w, ref


def _run(func, target, M, K, N):
    x, w, ref = _inputs(M, K, N)
    lib = tvm.tirx.build(func, target=target)
    out = tvm.runtime.tensor(np.zeros((M, w.shape[0] * w.shape[2]), np.float32))
    lib(tvm.runtime.tensor(x), tvm.runtime.tensor(w), out)
    return out.numpy()[:, :N], ref


def _asm(func, mcpu):
    return tvm.tirx.build(func, target=resolve_target(f"llvm:{mcpu}")).inspect_source("asm")


@pytest.mark.parametrize("mcpu,kernel", [("znver4", AVX512_BF16), ("sapphirerapids", AVX512_BF16),
                                         ("cooperlake", AVX512_BF16), ("icelake-server", None),
                                         ("znver3", None), ("x86-64", None)])
def test_kernel_follows_the_targets_features(mcpu, kernel):
    assert bf16_dot_kernel(resolve_target(f"llvm:{mcpu}")) == kernel


@pytest.mark.parametrize("mcpu", ["znver4", "sapphirerapids"])
def test_vdpbf16ps_is_in_the_assembly(mcpu):
    """Compiled for AVX512_BF16 CPUs (run nowhere here): the k-pair × 16-column step is one ``vdpbf16ps``."""
    asm = _asm(_schedule(_dense(8, 37, 40), tensorize=True), mcpu)
    lines = [line for line in asm.splitlines() if "vdpbf16ps" in line.split()]
    assert lines and all("%zmm" in line for line in lines), lines[:4]


@pytest.mark.parametrize("M,K,N", [(8, 37, 40), (4, 13, 100), (12, 64, 48), (4, 3, 9)])
def test_the_loop_nest_matches_numpy(M, K, N):
    """The layout and the intrinsic's description, not tensorized (any host): K odd (a zero k past it), N not a
    multiple of the panel. Products of bfloat16 are exact in fp32; the sums differ from float64 by rounding."""
    out, ref = _run(_schedule(_dense(M, K, N), tensorize=False), resolve_target("llvm"), M, K, N)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4 * np.sqrt(K))


@pytest.mark.skipif(not HAS_BF16, reason="this CPU lacks avx512_bf16 (reads /proc/cpuinfo)")
@pytest.mark.parametrize("M,K,N", [(8, 37, 40), (4, 13, 100), (12, 64, 48)])
def test_vdpbf16ps_kernel_matches_numpy(M, K, N):
    """vdpbf16ps adds a pair's odd k first and flushes denormals: equal to the fp32 loop to a few ulps on normal
    values."""
    out, ref = _run(_schedule(_dense(M, K, N), tensorize=True), resolve_target("llvm"), M, K, N)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4 * np.sqrt(K))


# --- the bf16 precision's dense through the compile path -------------------------------------------------------

def _model(rows, K, N, act="gelu", seed=0, transpose_b=False):
    import math

    from tvm import relax

    from tvm_fusion_ext.ops.registry import call_op

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((K, N)) / math.sqrt(K)).astype("float32")
    b = rng.standard_normal(N).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((*rows, K), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            given = {"x": x, "w": relax.const(np.ascontiguousarray(w.T) if transpose_b else w),
                     "bias": relax.const(b)}
            d = bb.emit(call_op(bb, "fused_dense", given, {"act": act, "transpose_b": transpose_b}))
            out = bb.emit_output(d)
        bb.emit_func_output(out)
    return bb.get(), w, b


def _bf16_reference(x, w, b, act):
    from tvm_fusion_ext.testing import numpy_activation

    xb = x.astype(ml_dtypes.bfloat16).astype(np.float64)
    wb = w.astype(ml_dtypes.bfloat16).astype(np.float64)
    return numpy_activation(xb @ wb + b, act)


@pytest.mark.parametrize("mcpu,rows", [("znver4", (2, 8)), ("sapphirerapids", (2, 8)), ("znver4", "sym")])
def test_bf16_precision_multiplies_with_vdpbf16ps_and_records_it(mcpu, rows):
    from tvm import tirx

    from tvm_fusion_ext.compile import compile_model

    rows = (2, tirx.Var("seq", "int64")) if rows == "sym" else rows
    mod, _, _ = _model(rows, 101, 80, transpose_b=True)  # K odd, N not a panel multiple, an (N, K) weight
    compiled = compile_model(mod, resolve_target(f"llvm:{mcpu}"), fuse_graph=False, precision="bf16")
    asm = compiled.executable.mod.imports[0].inspect_source("asm")
    lines = [line for line in asm.splitlines() if "vdpbf16ps" in line.split()]
    assert lines and all("%zmm" in line for line in lines), lines[:4]
    assert compiled.precision.features == ["avx2", "fma", "avx512f", "avx512bf16"]


def test_every_dense_of_a_module_links_the_bitcast_wrapper():
    """Each dense function carries the LLVM IR wrapper; two in one module link (the imported definitions are
    available_externally, inlined and dropped)."""
    from tvm import relax

    from tvm_fusion_ext.compile import compile_model
    from tvm_fusion_ext.ops.registry import call_op

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for k, n in ((64, 96), (96, 64)):
                given = {"x": h, "w": relax.const(rng.standard_normal((k, n)).astype("float32")),
                         "bias": relax.const(np.zeros(n, "float32"))}
                h = bb.emit(call_op(bb, "fused_dense", given, {"act": "gelu"}))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    compiled = compile_model(bb.get(), resolve_target("llvm:znver4"), fuse_graph=False, precision="bf16")
    asm = compiled.executable.mod.imports[0].inspect_source("asm")
    assert compiled.precision.converted == {"fused_dense": 2}
    assert "vdpbf16ps" in asm and "tfx_dot_16x2_bf16_dpbf16ps512" not in asm  # inlined, no call left


def test_without_avx512_bf16_the_weights_are_widened_and_no_dot_feature_is_recorded():
    from tvm_fusion_ext.compile import compile_model
    from tvm_fusion_ext.compile.precision import target_features

    for mcpu in ("icelake-server", "znver3"):
        target = resolve_target(f"llvm:{mcpu}")
        compiled = compile_model(_model((4,), 16, 32)[0], target, fuse_graph=False, precision="bf16")
        assert "vdpbf16ps" not in compiled.executable.mod.imports[0].inspect_source("asm")
        assert "avx512bf16" not in compiled.precision.features
        assert "avx512bf16" not in target_features(target, "bf16")


def _bits_module(rows, K, N, nr=16, act="gelu", seed=0):
    """fused_dense on bf16 bit patterns with a dot_panels weight, as the bf16 precision hands it to an AVX512_BF16
    target, built here for this host: the template declines the layout (no vdpbf16ps) and the fallback runs the
    operator's own loop nest."""
    from tvm import relax

    from tvm_fusion_ext.ops.registry import call_op

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((K, N)).astype("float32") / np.sqrt(K)
    b = rng.standard_normal(N).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((*rows, K), "uint16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            given = {"x": x, "w": relax.const(pack_dot_panels(_bits(w), nr, 2)), "bias": relax.const(b)}
            d = bb.emit(call_op(bb, "fused_dense", given, {"act": act, "w_layout": "dot_panels",
                                                            "out_features": N, "row_block": 4}))
            out = bb.emit_output(d)
        bb.emit_func_output(out)
    return bb.get(), w, b


@pytest.mark.parametrize("rows,K,N", [((13,), 37, 40), ((2, 3), 24, 48), ((1,), 3, 9), ("sym", 41, 33)])
def test_dot_panels_layout_matches_numpy_on_this_host(rows, K, N):
    from tvm import relax, tirx

    from tvm_fusion_ext.compile import compile_model

    module_rows, run_rows = ((2, tirx.Var("seq", "int64")), (2, 7)) if rows == "sym" else (rows, rows)
    mod, w, b = _bits_module(module_rows, K, N)
    compiled = compile_model(mod, resolve_target("llvm"), fuse_graph=False)
    xf = np.random.default_rng(2).standard_normal((*run_rows, K)).astype("float32")
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(_bits(xf))).numpy()
    np.testing.assert_allclose(out, _bf16_reference(xf, w, b, "gelu"), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not HAS_BF16, reason="this CPU lacks avx512_bf16 (reads /proc/cpuinfo)")
@pytest.mark.parametrize("rows,K,N", [((13,), 37, 40), ((2, 3), 24, 48), ("sym", 41, 33)])
def test_bf16_precision_on_vdpbf16ps_matches_numpy(rows, K, N):
    from tvm import relax, tirx

    from tvm_fusion_ext.compile import compile_model

    module_rows, run_rows = ((2, tirx.Var("seq", "int64")), (2, 7)) if rows == "sym" else (rows, rows)
    mod, w, b = _model(module_rows, K, N)
    compiled = compile_model(mod, resolve_target("llvm"), fuse_graph=False, precision="bf16")
    assert "vdpbf16ps" in compiled.executable.mod.imports[0].inspect_source("asm")
    x = np.random.default_rng(2).standard_normal((*run_rows, K)).astype("float32")
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(out, _bf16_reference(x, w, b, "gelu"), rtol=1e-4, atol=1e-4)


def test_a_tuning_record_of_the_template_replays_to_vdpbf16ps_and_other_cpus_decline_it():
    """The template's trace (what a tuning record stores) names the intrinsic and carries the LLVM IR import;
    replayed from its JSON on a fresh schedule it builds to the instruction. A CPU without AVX512_BF16 declines the
    layout in one line."""
    import json

    from tvm_fusion_ext.ops.dense import fused_dense
    from tvm_fusion_ext.schedules.cpu.dense import DenseCPU

    params = {"act": "gelu", "w_layout": "dot_panels", "out_features": 40, "row_block": 8, "row_clamp": "min"}
    x = te.placeholder((16, 37), "uint16", name="x")
    w = te.placeholder((3, 19, 16, 2), "uint16", name="w")
    func = te.create_prim_func([x, w, fused_dense(x, w, None, **params)]).with_attr("tfx.params", json.dumps(params))
    target = resolve_target("llvm:znver4")
    sch = s_tir.Schedule(func)
    assert DenseCPU().decline(sch, sch.get_sblock("dense"), target) is None
    DenseCPU().schedule(sch, sch.get_sblock("dense"), target)
    record = str(tvm.ir.save_json(sch.trace.as_json()))
    assert AVX512_BF16.name in record and IMPORT_LLVM_KEY in record
    replayed = s_tir.Schedule(func)
    s_tir.schedule.Trace.apply_json_to_schedule(tvm.ir.load_json(record), replayed)
    assert "vdpbf16ps" in tvm.tirx.build(replayed.mod["main"], target=target).inspect_source("asm")
    here = s_tir.Schedule(func)
    reason = DenseCPU().decline(here, here.get_sblock("dense"), resolve_target("llvm:znver3"))
    assert reason and "no bf16 dot-product instruction" in reason
