"""The CUDA decode attention (schedules/cuda/decode_attention.py) compiled by nvcc for sm_80 and sm_90: the split
and combine kernels with no spills and no stack, their registers and shared memory reported, for fp32 and fp16
at head dims 64 and 128 (MHA, LLaMA-7B's GQA 4, MQA); and a symbolic attention whose one-row branch launches them
(the host-side ``if rows == 1`` builds through TVM's CUDA lowering and codegen)."""

import logging
import shutil

import pytest
import tvm
from tvm import relax, s_tir, tirx

from tvm_fusion_ext.compile.pipeline import compile_model
from tvm_fusion_ext.ops import call_op
from tvm_fusion_ext.ops.registry import make_prim_func
from tvm_fusion_ext.schedules.cuda.decode_attention import cuda_decode_params
from tvm_fusion_ext.schedules.registry import get_template
from tvm_fusion_ext.targets import cuda_target, resolve_target
from tvm_fusion_ext.testing import build_module
from tvm_fusion_ext.tools.inspect_cuda import cuda_sources, kernel_report

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


@pytest.fixture(autouse=True)
def _nvcc_mode(monkeypatch):
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")


def decode_report(heads, kv_heads, head_dim, dtype, arch, keys=None):
    """nvcc's report of each kernel of the decode attention at these heads over ``keys`` keys (symbolic when
    None), with a padded past's mask."""
    keys = keys if keys is not None else tirx.Var("keys", "int64")
    types = {"q": relax.TensorType([1, 1, heads, head_dim], dtype),
             "k": relax.TensorType([1, keys, kv_heads, head_dim], dtype),
             "v": relax.TensorType([1, keys, kv_heads, head_dim], dtype),
             "mask": relax.TensorType([1, 1, 1, keys], dtype)}
    func = make_prim_func("fused_attention", types, cuda_decode_params({"scale": head_dim ** -0.5}, keys))
    sch = s_tir.Schedule(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), seed=1)
    target = cuda_target(arch)
    get_template("tfx.decode_attention", target)(sch, sch.get_sblock("dec_out"), target)
    with target:
        lib = tvm.compile(sch.mod, target)
    return kernel_report(lib.mod.imports[0].inspect_source(), arch)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("heads,kv_heads,head_dim,dtype", [
    (32, 8, 128, "float16"),   # LLaMA-7B-like GQA 4
    (32, 8, 128, "float32"),
    (8, 8, 64, "float16"),     # MHA
    (16, 1, 64, "float32"),    # MQA
])
def test_decode_kernels_keep_everything_in_registers(arch, heads, kv_heads, head_dim, dtype):
    rows = decode_report(heads, kv_heads, head_dim, dtype, arch)
    assert len(rows) == 2, rows  # the splits and the combine
    for row in rows:
        print(arch, dtype, heads, kv_heads, head_dim, row)  # the register report (pytest -s)
        assert row["spill_bytes"] == 0 and row["stack_bytes"] == 0, row
        assert row["registers"] <= 128, row
    splits = max(rows, key=lambda r: r["smem_bytes"])
    assert splits["threads_per_block"] == heads // kv_heads * 32, splits
    assert 0 < splits["smem_bytes"] <= 48 * 1024, splits


def test_symbolic_attention_builds_its_decode_branch_for_cuda(caplog):
    batch, seq, keys = (tirx.Var(n, "int64") for n in ("batch", "seq", "keys"))
    args = [relax.Var("q", relax.TensorType([batch, seq, 32, 128], "float16"))]
    args += [relax.Var(n, relax.TensorType([batch, keys, 8, 128], "float16")) for n in "kv"]
    args.append(relax.Var("mask", relax.TensorType([batch, 1, seq, keys], "float16")))
    mod = build_module(args, lambda bb: call_op(bb, "fused_attention", dict(zip("qkv", args[:3]), mask=args[3]),
                                                {"scale": 128 ** -0.5, "causal": True}))
    with caplog.at_level(logging.INFO, logger="tvm_fusion_ext"):
        compiled = compile_model(mod, resolve_target("cuda:sm_90"), fuse_graph=False)
    dropped = [r.getMessage() for r in caplog.records if "no run-time branches" in r.getMessage()]
    assert not dropped, dropped
    rows = [row for src in cuda_sources(compiled.executable) for row in kernel_report(src, "sm_90")]
    assert all(r["spill_bytes"] == 0 and r["stack_bytes"] == 0 for r in rows), rows
    # the flash loop's kernels and the decode branch's two (splits, combine) in one function's launches
    assert len(rows) >= 4, rows


def test_decode_kernels_are_flagged_in_the_report():
    rows = decode_report(8, 2, 64, "float16", "sm_90", keys=300)  # a static one-row attention: decode form only
    assert rows and all(r["decode"] for r in rows), rows


@pytest.mark.slow  # a symbolic decoder built for CUDA with nvcc: ~1 min on 2 cores
def test_inspect_cuda_shows_the_decoders_decode_kernels(tiny_causal_lm):
    """``inspect-cuda`` on the tiny LLaMA decoder (KV cache, GQA, dynamic lengths): its attention kernel carries the
    one-row branch, whose two kernels (splits, combine) the report flags; nothing spills."""
    from tvm_fusion_ext.tools.inspect_cuda import format_table, inspect_cuda

    rows = inspect_cuda(tiny_causal_lm, arch="sm_90")
    attention = [r for r in rows if r["name"].startswith("fused_attention")]
    decode = [r for r in attention if r["decode"]]
    assert len(decode) == 2 and len(attention) > len(decode), attention
    assert all(r["spill_bytes"] == 0 for r in attention), attention
    assert "decode" in format_table(rows).splitlines()[0]
