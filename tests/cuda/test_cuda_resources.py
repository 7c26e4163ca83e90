"""The compile-time report of the CUDA templates (``tvm-fusion inspect-cuda``'s registers, spills, stack, tensor-core
use), checked with ``ptxas -v`` so that a schedule change that makes a kernel spill fails here and not on a GPU:
the tensor-core dense at the shapes of all-MiniLM-L6-v2 (seq 128, fp16, sm_80) and at BERT-base / LLaMA-7B shapes.

The default unroll (64 steps without an activation, 16 with one) is what keeps the two K = 384 projections without
activation (MiniLM's ``fused_dense_kernel`` and ``fused_dense1_kernel``) spill-free on sm_80: at 16 steps TVM
leaves their 12-step K loop rolled, nvcc unrolls it itself, and ptxas keeps an 8-byte stack frame with 16 bytes
of spills; and the GELU epilogue at K = N = 384 on sm_90, which spills 72 bytes at 64 steps."""

import shutil

import pytest
import tvm
from tvm import relax, s_tir

from tvm_fusion_ext.ops.registry import make_prim_func
from tvm_fusion_ext.schedules.registry import get_template
from tvm_fusion_ext.targets import cuda_target
from tvm_fusion_ext.tools.inspect_cuda import kernel_report

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


@pytest.fixture(autouse=True)
def _nvcc_mode(monkeypatch):
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")


def _dense_report(M, K, N, act, transpose_b, arch):
    types = {"x": relax.TensorType([1, M, K], "float16"), "w": relax.TensorType([N, K] if transpose_b else [K, N],
                                                                               "float16"),
             "bias": relax.TensorType([N], "float16")}
    func = make_prim_func("fused_dense", types, {"act": act, "transpose_b": transpose_b})
    sch = s_tir.Schedule(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), seed=1)
    block = next(b for b in sch.get_child_blocks(sch.get_sblock("root"))
                 if str(sch.get(b).annotations.get("schedule_rule", "")) == "tfx.dense")
    target = cuda_target(arch)
    get_template("tfx.dense", target)(sch, block, target)
    with target:
        lib = tvm.compile(sch.mod, target)
    (row,) = kernel_report(lib.mod.imports[0].inspect_source(), arch)
    return row


@pytest.mark.parametrize("M,K,N,act,transpose_b", [
    (128, 384, 1152, "none", False),   # MiniLM's QKV projection (fused_dense_kernel)
    (128, 384, 384, "none", False),    # its output projection (fused_dense1_kernel)
    (128, 384, 1536, "gelu", False),   # its FFN up
    (128, 1536, 384, "none", False),   # its FFN down
    (512, 768, 3072, "gelu", True),    # BERT-base FFN up, batch 4
    (16, 4096, 4096, "none", True),    # LLaMA-7B projection, a decode-sized batch
])
def test_tensor_core_dense_keeps_everything_in_registers(M, K, N, act, transpose_b):
    row = _dense_report(M, K, N, act, transpose_b, "sm_80")
    assert row["tensor_core"], row
    assert row["spill_bytes"] == 0 and row["stack_bytes"] == 0, row
    assert row["registers"] <= 64, row  # 16 fp32 accumulators and two fragments: far from the limit
