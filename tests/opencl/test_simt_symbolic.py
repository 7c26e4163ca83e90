"""Whole scheduled modules through the OpenCL stand-in, kernels on PoCL and the rest on the CPU's VM, at run-time
sizes that are not multiples of any tile: the symbolic chain (dense + GELU → causal attention → LayerNorm, batch
and sequence symbolic) and packed (varlen) attention, full and causal. The causal key-block bound that broke these
kernels on a GPU (symbolic causal and packed attention) fails here too when it is applied to this target."""

import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_fusion_ext.compile.pipeline import compile_model, prepare
from tvm_fusion_ext.compile.schedule import schedule
from tvm_fusion_ext.tools.simt_on_cpu import emulate_relax

TESTS = Path(__file__).resolve().parents[1]


def _helpers():
    for sub in ("gpu", "ops", "cuda"):
        if str(TESTS / sub) not in sys.path:
            sys.path.insert(0, str(TESTS / sub))


def emulated_vm(mod, target):
    lowered, _ = prepare(mod, target, fuse_graph=False)
    executable, kernels = emulate_relax(schedule(lowered, target), target)
    return relax.VirtualMachine(executable, tvm.cpu()), kernels


def test_symbolic_chain_matches_the_cpu_build_at_every_length(simt):
    _helpers()
    from test_cuda_numerics import symbolic_chain_module

    mod, shapes = symbolic_chain_module()
    vm, kernels = emulated_vm(mod, simt)
    assert len(kernels) == 3  # dense, attention, LayerNorm: every kernel ran on PoCL
    on_cpu = relax.VirtualMachine(compile_model(mod, "llvm", fuse_graph=False).executable, tvm.cpu())
    rng = np.random.default_rng(0)
    for batch, seq in ((1, 1), (1, 37), (3, 100), (2, 64)):
        feeds = [rng.standard_normal([batch, seq, 256] if n == "x" else [int(d) for d in sh]).astype("float32")
                 if n != "mask" else np.where(rng.random((batch, 1, 1, seq)) < 0.2, -1e4, 0).astype("float32")
                 for n, sh in shapes.items()]
        got = vm["main"](*[tvm.runtime.tensor(a) for a in feeds]).numpy()
        want = on_cpu["main"](*[tvm.runtime.tensor(a) for a in feeds]).numpy()
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4, err_msg=f"batch {batch}, seq {seq}")


@pytest.mark.parametrize("dtype,causal,kv_heads,tol", [
    ("float32", False, 4, 3e-5),
    ("float32", True, 2, 3e-5),
    pytest.param("float16", True, 4, 2e-2, marks=pytest.mark.slow),
])
def test_packed_attention_matches_per_sequence_attention(simt, dtype, causal, kv_heads, tol):
    """Also the guard of the row maximum's hand-over: kept in shared memory, lane 0 of a row stored it and the other
    lanes read it with no barrier between (right only in a warp's lockstep); this emulation fills shared memory
    with NaN and runs work-items unsynchronised between barriers, so that read gave NaN everywhere."""
    _helpers()
    from test_attention_varlen import packed_inputs, reference
    from test_cuda_varlen import packed_attention_module

    vm, _ = emulated_vm(packed_attention_module(dtype, causal, kv_heads=kv_heads), simt)
    for lengths, span in (([1, 64, 17, 0, 33], 64), ([5, 1, 16, 3], 16)):
        arrays = packed_inputs(lengths, span, kv_heads, seed=sum(lengths), head_dim=64)
        arrays = [a.astype(dtype) if a.dtype == np.float32 else a for a in arrays]
        got = vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy().astype("float32")
        want = reference(*[a.astype("float64") if a.dtype.kind == "f" else a for a in arrays[:4]],
                         arrays[5].astype("float64"), 0.125, causal)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"lengths {lengths}")
