"""The packed (varlen) form of fused_attention through the CUDA attention template, with the symbolic token
count RemovePadding gives it: compiled with nvcc for sm_80 / sm_90, no template declines (the generic fallback
would be silently taken), no spills."""

import logging
import shutil
import warnings

import pytest
from tvm import relax, tirx

from tvm_fusion_ext.compile.pipeline import compile_model
from tvm_fusion_ext.ops import call_op
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.testing import build_module
from tvm_fusion_ext.tools.inspect_cuda import cuda_sources, kernel_report

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
NAMES = ("q", "k", "v", "cu_seqlens", "row_seq", "key_bias")


@pytest.fixture(autouse=True)
def _nvcc_mode(monkeypatch):
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")


def packed_attention_module(dtype, causal, heads=4, kv_heads=4, head_dim=64, static=False):
    """Symbolic sizes as RemovePadding gives them, or (``static``) 64 tokens in 2 sequences of at most 64."""
    tokens, nseq, span = (64, 2, 64) if static else (tirx.Var(n, "int64") for n in ("tokens", "nseq", "span"))
    shapes = ([1, tokens, heads, head_dim], [1, tokens, kv_heads, head_dim], [1, tokens, kv_heads, head_dim],
              [nseq + 1], [tokens], [nseq, span])
    dtypes = (dtype,) * 3 + ("int64", "int64", dtype)
    args = [relax.Var(n, relax.TensorType(s, t)) for n, s, t in zip(NAMES, shapes, dtypes)]
    params = {"scale": 0.125, "causal": causal}
    return build_module(args, lambda bb: call_op(bb, "fused_attention", dict(zip(NAMES, args)), params))


@pytest.mark.parametrize("dtype,causal,kv_heads,arch,static", [
    ("float32", False, 4, "sm_90", False),
    ("float32", True, 2, "sm_80", False),
    ("float16", False, 4, "sm_90", False),
    ("float16", True, 4, "sm_90", True),  # static 16-multiples: SIMT too (the tensor-core template reads K/V in place)
])
def test_packed_attention_compiles_with_the_template(dtype, causal, kv_heads, arch, static, caplog):
    with caplog.at_level(logging.INFO, logger="tvm_fusion_ext"), warnings.catch_warnings():
        warnings.simplefilter("error")  # a template failure (fallback warning) fails the test
        compiled = compile_model(packed_attention_module(dtype, causal, kv_heads=kv_heads, static=static),
                                 resolve_target(f"cuda:{arch}"), fuse_graph=False)
    declined = [r.getMessage() for r in caplog.records if " declines " in r.getMessage()]
    assert not declined, declined
    sources = cuda_sources(compiled.executable)
    rows = [row for src in sources for row in kernel_report(src, arch)]
    assert rows and all(r["spill_bytes"] == 0 and r["stack_bytes"] == 0 for r in rows), rows
    attention = [r for r in rows if r["name"].startswith("fused_attention")]
    assert len([r for r in attention if r["smem_bytes"] > 0]) == 1  # the flash loop, one block per query tile
    assert any("row_seq" in src and "cu_seqlens" in src for src in sources)  # the packed form, not the padded
