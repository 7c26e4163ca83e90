"""CUDA templates compile with nvcc (no GPU needed): zero spills, tensor cores where promised, and the
``inspect-cuda`` report on the tiny encoder."""

import json
import shutil

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir

from tvm_fusion_ext.errors import TargetError
from tvm_fusion_ext.tools.inspect_cuda import (
    FIELDS,
    cuda_sources,
    inspect_cuda,
    kernel_report,
    parse_ptxas,
    tensor_core_kernels,
)
from tvm_fusion_ext.ops.registry import make_prim_func
from tvm_fusion_ext.schedules.registry import get_template
from tvm_fusion_ext.targets import resolve_target

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


@pytest.fixture(autouse=True)
def _nvcc_mode(monkeypatch):
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")


def _scheduled(op, inputs, params, rule, arch):
    ty = lambda s, dt: relax.TensorType(list(s), dt)  # noqa: E731
    func = make_prim_func(op, {k: ty(*v) for k, v in inputs.items()}, params)
    sch = s_tir.Schedule(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), seed=1)
    target = resolve_target(f"cuda:{arch}")
    root = sch.get_child_blocks(sch.get_sblock("root"))
    block = next(b for b in root if str(sch.get(b).annotations.get("schedule_rule", "")) == rule)
    get_template(rule, target)(sch, block, target)
    return sch.mod, target


def _report(mod, target, arch):
    (src,) = cuda_sources(tvm.compile(mod, target))
    (row,) = kernel_report(src, arch)
    return row, src


def _dense(M, K, N, dtype, arch, transpose_b=False, act="gelu"):
    inputs = {"x": ((1, M, K), dtype), "w": (((N, K) if transpose_b else (K, N)), dtype), "bias": ((N,), dtype)}
    mod, target = _scheduled("fused_dense", inputs, {"act": act, "transpose_b": transpose_b}, "tfx.dense", arch)
    return _report(mod, target, arch)


def _barriers_around_loads(src):
    """Problems with the block barriers around each ldmatrix of ``src``'s main kernel: a load with no barrier
    before it (or a shared store between that barrier and the load), none after it, or one under a branch (a
    barrier only some warps reach hangs the block)."""
    body = src[src.index("main_kernel("):]
    lines = [ln.strip() for ln in body.splitlines()]
    problems, opened, loads = [], [], 0
    for n, ln in enumerate(lines):
        if "ldmatrix" in ln and ln.startswith('"'):
            loads += 1
            barriers = [m for m, prev in enumerate(lines[:n]) if prev.startswith("__syncthreads")]
            if not barriers or any("uint4" in prev or "_shared_ptr[" in prev.split("=")[0]
                                   for prev in lines[barriers[-1]:n] if "=" in prev):
                problems.append(f"line {n}: no barrier between the tile's stores and the load")
            if not any(nxt.startswith("__syncthreads") for nxt in lines[n:n + 12]):
                problems.append(f"line {n}: no barrier after the load")
            if any(o.startswith(("if", "else", "while")) for o in opened):
                problems.append(f"line {n}: the load and its barriers sit under a branch")
        for _ in range(ln.count("}")):
            if opened:
                opened.pop()
        opened.extend([ln] * ln.count("{"))
    return loads, problems


@needs_nvcc
@pytest.mark.parametrize("M,K,N,dtype,arch,transpose_b", [
    (128, 384, 1152, "float32", "sm_80", False),
    (128, 1536, 384, "float32", "sm_90", True),
    (128, 384, 384, "float16", "sm_90", False),
    (128, 768, 3072, "float16", "sm_80", True),
    (128, 3072, 768, "bfloat16", "sm_90", False),
])
def test_dense_compiles_without_spills(M, K, N, dtype, arch, transpose_b):
    row, src = _dense(M, K, N, dtype, arch, transpose_b)
    assert row["spill_bytes"] == 0 and row["stack_bytes"] == 0, row
    assert 0 < row["threads_per_block"] <= 1024
    assert row["smem_bytes"] <= resolve_target(f"cuda:{arch}").attrs["max_shared_memory_per_block"]
    # fp16/bf16 at multiples of 16 must run on tensor cores (mma.sync in the PTX), fp32 must not
    assert row["tensor_core"] == (dtype != "float32"), row
    if dtype != "float32":
        assert "ldmatrix" in src and "mma.sync.aligned.m16n8k16" in src


@needs_nvcc
@pytest.mark.parametrize("M,K,N,dtype", [(16, 16, 32, "float16"), (128, 384, 768, "bfloat16")])
def test_dense_tensor_core_loads_wait_for_the_block(M, K, N, dtype):
    """Every ldmatrix of the tensor-core dense sits between two ``__syncthreads``: the cooperative stores of a
    shared tile must land before any warp reads it, and every warp must be done reading before the next K step
    overwrites it. TVM's ThreadSync sees neither the asm nor ``address_of``, and without the barriers an H100
    gave garbage in the second warp's columns at 16x16x32 (``scripts/gpu_check.py``; right with them)."""
    _, src = _dense(M, K, N, dtype, "sm_90", act="none")
    loads, problems = _barriers_around_loads(src)
    assert loads and not problems, problems


def _attention(S, D, dtype, layout, arch, heads=4, softcap=0.0):
    key_block = min(64, S)  # as the build path sets for CUDA (AttentionCUDA.prepare_operator)
    shape = (1, S, heads, D) if layout == "BSHD" else (1, heads, S, D)
    inputs = {"q": (shape, dtype), "k": (shape, dtype), "v": (shape, dtype), "mask": ((1, 1, 1, S), dtype)}
    params = {"scale": D ** -0.5, "key_block": key_block,
              **{f"{t}_layout": layout for t in ("q", "k", "v", "out")}}
    if softcap:
        params["softcap"] = softcap
    mod, target = _scheduled("fused_attention", inputs, params, "tfx.attention", arch)
    (src,) = cuda_sources(tvm.compile(mod, target))
    return kernel_report(src, arch), src


@needs_nvcc
@pytest.mark.parametrize("S,D,dtype,layout,arch,kernels", [
    # K and V read in place: one kernel (25 s of nvcc: slow tier; the bfloat16 case below is the same path)
    pytest.param(128, 64, "float16", "BSHD", "sm_80", 1, marks=pytest.mark.slow),
    (128, 32, "bfloat16", "BHSD", "sm_90", 1),
    # 80 keys pad to 2 blocks of 64: clamped key-block copies (15 s: slow tier)
    pytest.param(80, 32, "float16", "BSHD", "sm_80", 3, marks=pytest.mark.slow),
    (32, 16, "float16", "BSHD", "sm_80", 1),    # head dim 16: fp16 tiles aliasing a dead fp32 tile
])
def test_attention_fp16_runs_both_matmuls_on_tensor_cores(S, D, dtype, layout, arch, kernels, mma_attention):
    rows, src = _attention(S, D, dtype, layout, arch)
    assert len(rows) == kernels, rows
    assert all(r["spill_bytes"] == 0 and r["stack_bytes"] == 0 for r in rows), rows
    main = max(rows, key=lambda r: r["smem_bytes"])
    assert main["tensor_core"], main
    assert main["smem_bytes"] <= resolve_target(f"cuda:{arch}").attrs["max_shared_memory_per_block"]
    # both matmuls: ldmatrix with and without .trans (Kᵀ read as (key, d) in place, V as (key, d))
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in src and "ldmatrix.sync.aligned.m8n8.x4.trans" in src
    assert src.count("mma.sync.aligned.m16n8k16") >= 4


@needs_nvcc
@pytest.mark.parametrize("S,D,dtype,layout", [
    (128, 32, "bfloat16", "BHSD"),  # K and V read in place
    (96, 64, "float16", "BSHD"),    # padded key blocks: K and V through the clamped copies
])
def test_attention_tensor_core_loads_wait_for_the_block(S, D, dtype, layout, mma_attention):
    """As the dense template's: the Q, K, V and probability tiles are stored by the whole block (or by other
    lanes) and read by ldmatrix, which ThreadSync does not see. The 2026-11-27 H200 run of the template without
    these barriers gave 4-20 % wrong outputs (NaN at bf16). Every warp runs the same loads, so no barrier may
    sit under a branch."""
    _, src = _attention(S, D, dtype, layout, "sm_90")
    loads, problems = _barriers_around_loads(src)
    assert loads >= 8 and not problems, problems


@needs_nvcc
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_attention_16_bit_takes_simt_unless_asked(dtype, monkeypatch):
    """Until the tensor-core attention has passed on a GPU, 16-bit attention is SIMT (which matched on an H200)
    unless TFX_CUDA_MMA_ATTENTION=1 asks for it."""
    from tvm_fusion_ext.schedules.cuda.attention_mma import OPT_IN

    monkeypatch.delenv(OPT_IN, raising=False)
    rows, src = _attention(64, 32, dtype, "BSHD", "sm_90")
    assert not any(r["tensor_core"] for r in rows) and "mma" not in src, rows
    assert all(r["spill_bytes"] == 0 for r in rows), rows


@needs_nvcc
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_soft_capped_attention_compiles_on_its_usual_path(dtype, mma_attention):
    # Gemma 2's capped scores: one tanh per score inside the flash loop, same kernels and paths as uncapped
    rows, src = _attention(64, 32, dtype, "BHSD", "sm_90", softcap=50.0)
    assert all(r["spill_bytes"] == 0 and r["stack_bytes"] == 0 for r in rows), rows
    assert any(r["tensor_core"] for r in rows) == (dtype != "float32"), rows
    assert "tanh" in src


@needs_nvcc
def test_attention_fp16_odd_head_dim_takes_simt_path():
    rows, src = _attention(64, 24, "float16", "BSHD", "sm_80")
    assert not any(r["tensor_core"] for r in rows) and "mma" not in src
    assert all(r["spill_bytes"] == 0 for r in rows)


@needs_nvcc
def test_dense_fp16_odd_shape_takes_simt_path():
    row, src = _dense(12, 40, 24, "float16", "sm_90", act="none")
    assert not row["tensor_core"] and "mma" not in src
    assert row["spill_bytes"] == 0


@needs_nvcc
@pytest.mark.parametrize("N,dtype,arch", [(384, "float32", "sm_90"), (768, "float16", "sm_80"),
                                          (30, "float32", "sm_80"), (16384, "float32", "sm_90")])
def test_layernorm_compiles(N, dtype, arch):
    inputs = {"x": ((1, 128, N), dtype), "residual": ((1, 128, N), dtype), "bias": ((N,), dtype),
              "gamma": ((N,), dtype), "beta": ((N,), dtype)}
    mod, target = _scheduled("fused_layernorm", inputs, {"eps": 1e-12}, "tfx.layernorm", arch)
    row, src = _report(mod, target, arch)
    assert row["spill_bytes"] == 0 and row["stack_bytes"] == 0, row
    assert row["threads_per_block"] % 32 == 0
    assert "__shfl" in src  # the statistics are warp-shuffle reductions, not a serial loop


def test_parse_ptxas_and_ptx():
    log = """ptxas info    : Compiling entry function 'k_a' for 'sm_90'
ptxas info    : Function properties for k_a
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 1280 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'k_b' for 'sm_90'
ptxas info    : Function properties for k_b
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers, 380 bytes cmem[0]
"""
    res = parse_ptxas(log)
    assert res["k_a"] == {"registers": 40, "smem_bytes": 1280, "stack_bytes": 8, "spill_bytes": 8}
    assert res["k_b"] == {"registers": 10, "smem_bytes": 0, "stack_bytes": 0, "spill_bytes": 0}
    ptx = (".visible .entry k_a(\n{\n\tmma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1}, ...;\n}\n"
           ".visible .entry k_b(\n{\n\tfma.rn.f32 %f1, %f2, %f3, %f4;\n}\n")
    assert tensor_core_kernels(ptx) == {"k_a": True, "k_b": False}


def test_convert_dtype_float16_leaves_no_float32():
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.tools.inspect_cuda import convert_dtype
    from tvm_fusion_ext.models import default_model_path

    mod = convert_dtype(load_onnx(default_model_path()), "float16")
    text = mod["main"].script(show_meta=False)
    assert 'dtype="float32"' not in text and '"float32")' not in text
    assert 'dtype="float16"' in text
    assert str(mod["main"].ret_ty.dtype) == "float16"


def test_convert_dtype_float16_retypes_float_inputs():
    # a model fed floats (vision, audio, an encoder over embeddings): its parameters become float16 and every use
    # of them follows (this crashed: the rebinding helper it called does not exist in TVM 0.27)
    from onnx import TensorProto, helper, numpy_helper

    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.tools.inspect_cuda import convert_dtype

    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    mod = convert_dtype(load_onnx(model), "float16")
    assert [str(p.ty.dtype) for p in mod["main"].params] == ["float16"]
    text = mod["main"].script(show_meta=False)
    assert '"float32"' not in text and str(mod["main"].ret_ty.dtype) == "float16"


def test_unknown_arch_is_a_target_error():
    from tvm_fusion_ext.models import default_model_path

    with pytest.raises(TargetError, match="sm_1x"):
        inspect_cuda(default_model_path(), arch="sm_1x")


@needs_nvcc
def test_inspect_cuda_tiny_encoder():
    from tvm_fusion_ext.models import default_model_path

    rows = inspect_cuda(default_model_path(), arch="sm_90")
    assert rows and all(set(FIELDS) <= set(r) for r in rows)
    assert all(r["spill_bytes"] == 0 for r in rows), [r for r in rows if r["spill_bytes"]]
    names = [r["name"] for r in rows]
    assert any(n.startswith("fused_dense") for n in names) and any("layernorm" in n for n in names)
    assert not any(r["tensor_core"] for r in rows)  # fp32 has no tensor-core path


@needs_nvcc
@pytest.mark.slow  # 17 s of nvcc; the fp32 inspect-cuda tests stay in the default tier
def test_inspect_cuda_cli_fp16_json(capsys, mma_attention):
    from tvm_fusion_ext.cli import main
    from tvm_fusion_ext.models import default_model_path

    assert main(["inspect-cuda", default_model_path(), "--arch", "sm_80", "--dtype", "float16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all(r["spill_bytes"] == 0 for r in rows)
    dense = [r for r in rows if r["name"].startswith("fused_dense")]
    assert dense and all(r["tensor_core"] for r in dense), dense
    attention = [r for r in rows if r["name"].startswith("fused_attention")]
    assert attention and all(r["tensor_core"] for r in attention), attention

