"""The packed (varlen) fused_attention through the CUDA template, run on a real GPU against numpy attention
computed sequence by sequence (skipped without a GPU; tests/cuda/test_cuda_varlen.py compile-checks the same
kernels everywhere)."""

import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_fusion_ext.compile.pipeline import compile_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cuda"))
from test_attention_varlen import packed_inputs, reference  # noqa: E402
from test_cuda_varlen import packed_attention_module  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype,causal,kv_heads,tol", [("float32", False, 4, 3e-5), ("float32", True, 2, 3e-5),
                                                       ("float16", False, 4, 2e-2)])
def test_packed_attention_on_gpu(gpu, dtype, causal, kv_heads, tol):
    dev, target = gpu
    compiled = compile_model(packed_attention_module(dtype, causal, kv_heads=kv_heads), target, fuse_graph=False)
    vm = relax.VirtualMachine(compiled.executable, dev)
    for lengths, span in (([1, 64, 17, 0, 33], 64), ([64], 64), ([5, 1, 16, 3], 16)):
        arrays = packed_inputs(lengths, span, kv_heads, seed=sum(lengths), head_dim=64)
        arrays = [a.astype(dtype) if a.dtype == np.float32 else a for a in arrays]
        got = vm["main"](*[tvm.runtime.tensor(a, dev) for a in arrays]).numpy().astype("float64")
        want = reference(*[a.astype("float32") if a.dtype.kind == "f" else a for a in arrays[:4]],
                         arrays[5].astype("float32"), 0.125, causal)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
