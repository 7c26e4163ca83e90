"""fused_gated_dense: compute + CPU template against a float64 numpy gated unit (static and symbolic rows, packed
and run-time weights, a zero-padded last panel); the 2N-wide projection pair never becomes a global buffer; the
CUDA template compiles for sm_80 and sm_90 (fp32, fp16; static and symbolic rows) without spills."""

import re
import shutil

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir

from tvm_fusion_ext.compile import ApplyTemplates, build, lower
from tvm_fusion_ext.ops import call_op, op_of, params_of
from tvm_fusion_ext.ops.gated_dense import interleave_weights
from tvm_fusion_ext.ops.registry import make_prim_func
from tvm_fusion_ext.schedules.registry import get_template
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.testing import numpy_activation
from tvm_fusion_ext.schedules.cpu.dense import symbolic_mr

CPU = resolve_target("llvm")


def _reference(x, wg, wu, bias, act):
    x = x.astype("float64")
    g, u = x @ wg, x @ wu
    if bias is not None:
        g, u = g + bias[:, 0], u + bias[:, 1]
    return numpy_activation(g, act) * u


def _model(rows, K, wg, wu, bias, act, weight_is_param=False):
    x = relax.Var("x", relax.TensorType((*rows, K), "float32"))
    params = [x]
    w = relax.const(interleave_weights(wg, wu))
    if weight_is_param:
        w = relax.Var("w", relax.TensorType(w.ty.shape, "float32"))
        params.append(w)
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            inputs = {"x": x, "w": w, "bias": None if bias is None else relax.const(bias)}
            y = bb.emit_output(call_op(bb, "fused_gated_dense", inputs, {"act": act}))
        bb.emit_func_output(y)
    return bb.get()


def _kernels(mod):
    return [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc) and op_of(f)]


def _weights(K, N, seed=0, bias=True):
    rng = np.random.default_rng(seed)
    wg, wu = ((rng.standard_normal((K, N)) / np.sqrt(K)).astype("float32") for _ in range(2))
    return wg, wu, (rng.standard_normal((N, 2)).astype("float32") if bias else None)


@pytest.mark.parametrize("rows,K,N,act,bias,weight_is_param", [
    ((2, 6), 32, 40, "silu", True, False),        # packed panels of 8
    ((12,), 48, 18, "gelu", False, False),        # N = 18: the last panel zero-padded past N
    ((1, 5), 32, 24, "gelu_tanh", True, True),    # a run-time weight, read in place
])
def test_cpu_template_matches_numpy(rows, K, N, act, bias, weight_is_param):
    wg, wu, b = _weights(K, N, bias=bias)
    mod = _model(rows, K, wg, wu, b, act, weight_is_param)
    lowered = lower(mod, CPU)
    (kernel,) = _kernels(lowered)
    assert params_of(kernel).get("w_layout", "plain") == ("plain" if weight_is_param else "packed")
    (scheduled,) = _kernels(ApplyTemplates(CPU, fallback=False)(lowered))
    assert bool(scheduled.attrs["tirx.is_scheduled"])  # the template, not the fallback
    # the projection pair is a register tile: the only buffer the kernel allocates is local
    sch = s_tir.Schedule(tvm.IRModule({"main": scheduled}))
    allocated = sch.get(sch.get_sblock("root")).alloc_buffers
    assert [b.scope() for b in allocated] == ["local"], allocated

    vm = relax.VirtualMachine(build(mod, CPU, fuse=False), tvm.cpu())
    x = np.random.default_rng(1).standard_normal((*rows, K)).astype("float32")
    args = [tvm.runtime.tensor(x)]
    if weight_is_param:
        args.append(tvm.runtime.tensor(interleave_weights(wg, wu)))
    got = vm["main"](*args).numpy()
    np.testing.assert_allclose(got, _reference(x, wg, wu, b, act), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("N", [40, 256])  # 256: 32 panels of 8 columns, run 4 per task (panel_group)
def test_symbolic_rows_take_the_template_padded_to_its_register_tile(N):
    batch, seq = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")
    K = 32
    wg, wu, b = _weights(K, N, seed=2)
    mod = _model((batch, seq), K, wg, wu, b, "silu")
    assert [params_of(f).get("row_block") for f in _kernels(lower(mod, CPU))] == [symbolic_mr(CPU)]
    scheduled = _kernels(ApplyTemplates(CPU, fallback=False)(lower(mod, CPU)))
    assert all(bool(f.attrs["tirx.is_scheduled"]) for f in scheduled)
    vm = relax.VirtualMachine(build(mod, CPU, fuse=False), tvm.cpu())
    rng = np.random.default_rng(3)
    for shape in ((1, 1), (2, 5), (3, 17)):
        x = rng.standard_normal((*shape, K)).astype("float32")
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(got, _reference(x, wg, wu, b, "silu"), rtol=1e-4, atol=1e-4)


def test_unknown_activation_is_one_clear_line():
    types = {"x": relax.TensorType((4, 8), "float32"), "w": relax.TensorType((8, 4, 2), "float32")}
    with pytest.raises(ValueError, match="fused_gated_dense: unknown gate activation 'swish'"):
        make_prim_func("fused_gated_dense", types, {"act": "swish"})


needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


@needs_nvcc
@pytest.mark.parametrize("M,K,N,dtype,arch", [
    (128, 256, 704, "float32", "sm_80"),
    (128, 256, 704, "float32", "sm_90"),
    (64, 512, 1408, "float16", "sm_80"),
    (64, 512, 1408, "float16", "sm_90"),
])
def test_cuda_template_compiles_without_spills(M, K, N, dtype, arch, monkeypatch):
    from tvm_fusion_ext.tools.inspect_cuda import cuda_sources, kernel_report

    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")
    ty = lambda s: relax.TensorType(list(s), dtype)  # noqa: E731
    func = make_prim_func("fused_gated_dense", {"x": ty((1, M, K)), "w": ty((K, N, 2)), "bias": ty((N, 2))},
                          {"act": "silu"})
    sch = s_tir.Schedule(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), seed=1)
    target = resolve_target(f"cuda:{arch}")
    get_template("tfx.gated_dense", target)(sch, sch.get_sblock("gated_dense"), target)
    (src,) = cuda_sources(tvm.compile(sch.mod, target))
    (row,) = kernel_report(src, arch)
    assert row["spill_bytes"] == 0 and row["stack_bytes"] == 0, row
    assert 0 < row["threads_per_block"] <= 1024
    assert row["smem_bytes"] <= target.attrs["max_shared_memory_per_block"]
    # one kernel writes the N-wide product: the 2N-wide pair is never a global buffer
    assert set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", src)) == {"main_kernel"}
    signature = src[src.index("main_kernel("):]
    signature = signature[:signature.index(")")]
    assert signature.count("*") == 4, signature  # x, w, bias, out


@needs_nvcc
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cuda_template_takes_symbolic_rows(dtype, monkeypatch):
    """Dynamic batch × sequence on CUDA: the build pads the accumulator to one thread block's rows, the template
    (not a generic GPU rule) schedules it, and it compiles for sm_90 without spills."""
    from tvm_fusion_ext.tools.inspect_cuda import cuda_sources, kernel_report

    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")
    target = resolve_target("cuda:sm_90")
    batch, seq = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")
    x = relax.Var("x", relax.TensorType((batch, seq, 64), dtype))
    w = relax.const(np.random.default_rng(0).standard_normal((64, 96, 2)).astype(dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(call_op(bb, "fused_gated_dense", {"x": x, "w": w}, {"act": "silu"}))
        bb.emit_func_output(y)
    lowered = lower(bb.get(), target)
    assert [params_of(f).get("row_block") for f in _kernels(lowered)] == [32]
    scheduled = ApplyTemplates(target, fallback=False)(lowered)
    (kernel,) = _kernels(scheduled)
    assert bool(kernel.attrs["tirx.is_scheduled"])
    (src,) = cuda_sources(tvm.compile(tvm.IRModule({"main": kernel.with_attr("global_symbol", "main")}), target))
    (row,) = kernel_report(src, "sm_90")
    assert row["spill_bytes"] == 0 and 0 < row["threads_per_block"] <= 1024, row
