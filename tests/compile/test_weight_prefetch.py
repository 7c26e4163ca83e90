"""The CPU dense kernel prefetches the panel its thread's next task reads (compile/codegen/weight_prefetch.py), and keeps its
accumulator tile on the stack so that the prefetch call inside the k loop does not push the tile out of registers."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from tvm_fusion_ext.compile.finalize import finalize
from tvm_fusion_ext.compile.pipeline import prepare
from tvm_fusion_ext.compile.schedule import schedule
from tvm_fusion_ext.compile.codegen.weight_prefetch import InsertWeightPrefetch
from tvm_fusion_ext.ops import call_op
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.testing import build_module

K, N = 64, 256
TARGET = {"kind": "llvm", "mcpu": "znver4"}  # AVX-512: 32-wide panels, 8 panels; compiled here, not run


def _dense(x_shape, w, b, weight_param: bool = False):
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    params = [x]
    if weight_param:
        wv = relax.Var("w", relax.TensorType(list(w.shape), "float32"))
        params.append(wv)
    weight = params[1] if weight_param else relax.const(w)
    return build_module(params, lambda bb: bb.emit(call_op(bb, "fused_dense", {
        "x": x, "w": weight, "bias": relax.const(b)}, {"act": "gelu"})))


def _weights():
    rng = np.random.default_rng(0)
    return ((rng.standard_normal((K, N)) / np.sqrt(K)).astype("float32"),
            rng.standard_normal(N).astype("float32"))


def _scheduled(mod, target):
    lowered, _ = prepare(mod, target, fuse_graph=False)
    return schedule(lowered, target)


def _kernel_scripts(mod):
    return [f.script() for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]


def _gelu(v):
    from math import erf

    return 0.5 * v * (1 + np.vectorize(erf)(v / np.sqrt(2)))


@pytest.mark.parametrize("rows", ["static", "symbolic"])
def test_packed_dense_prefetches_the_next_panel(rows):
    w, b = _weights()
    shape = [1, 24, K] if rows == "static" else [tirx.Var("batch", "int64"), tirx.Var("seq", "int64"), K]
    target = resolve_target(TARGET)
    scheduled = _scheduled(_dense(shape, w, b), target)
    assert not any("T.prefetch" in s for s in _kernel_scripts(scheduled))
    with_prefetch = "\n".join(_kernel_scripts(InsertWeightPrefetch()(scheduled)))
    prefetches = [line.strip() for line in with_prefetch.splitlines() if "T.prefetch" in line]
    # one per 64-byte line of a 32-float panel row (two), in every row-count branch of the kernel
    assert prefetches and len(prefetches) % 2 == 0, prefetches
    assert "tfx.prefetch_weight" not in with_prefetch
    # the prefetched panel is the read one plus a whole task's panels (an integer), at locality 2 (L2)
    assert all(", 0, 2, 1)" in p and "w[" in p for p in prefetches)
    asm = finalize(scheduled, target).mod.imports[0].inspect_source("asm")
    assert "prefetcht1" in asm


@pytest.mark.parametrize("op", ["fused_dense", "fused_gated_dense"])
def test_one_and_two_row_branches_stream_without_the_next_task_prefetch(op):
    """A call of one or two rows (a decode step) reads each panel once and the hardware prefetchers keep up: its
    branches of a symbolic kernel carry no prefetch; the branches of wider row tiles keep theirs."""
    from tvm_fusion_ext.ops.gated_dense import interleave_weights

    w, b = _weights()
    x = relax.Var("x", relax.TensorType([tirx.Var("batch", "int64"), tirx.Var("seq", "int64"), K], "float32"))
    inputs = {"x": x, "w": relax.const(w), "bias": relax.const(b)} if op == "fused_dense" else \
        {"x": x, "w": relax.const(interleave_weights(w, w)), "bias": None}
    mod = build_module([x], lambda bb: bb.emit(call_op(bb, op, inputs, {"act": "gelu"})))
    kernel = next(s for s in _kernel_scripts(InsertWeightPrefetch()(_scheduled(mod, resolve_target(TARGET))))
                  if op in s)
    one_row, rest = kernel.split("if batch * seq <= T.int64(2):")
    two_rows, wider = rest.split("if batch * seq <= T.int64(4):")
    assert "if batch * seq <= T.int64(1):" in one_row
    assert "T.prefetch" not in one_row and "T.prefetch" not in two_rows
    assert "T.prefetch" in wider


@pytest.mark.parametrize("seq", [1, 5, 24, 40])
def test_prefetching_kernel_matches_numpy(seq):
    """The last task's prefetch looks past the end of W: harmless, and the result is the dense layer's."""
    w, b = _weights()
    target = resolve_target("llvm")
    mod = _dense([tirx.Var("batch", "int64"), tirx.Var("seq", "int64"), K], w, b)
    vm = relax.VirtualMachine(finalize(_scheduled(mod, target), target), tvm.cpu())
    x = np.random.default_rng(seq).standard_normal((1, seq, K)).astype("float32")
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(out, _gelu(x.astype("float64") @ w + b), rtol=1e-4, atol=1e-4)


def test_accumulator_tile_is_a_stack_alloca():
    """The 8 × 32 tile (1 KiB) would be a TVMBackendAllocWorkspace: with a call in the k loop LLVM then stores it
    back every step (the kernel ran 2.1–2.3× slower)."""
    w, b = _weights()
    target = resolve_target(TARGET)
    ll = finalize(_scheduled(_dense([1, 24, K], w, b), target), target).mod.imports[0].inspect_source("ll")
    assert "llvm.prefetch" in ll
    assert "load ptr, ptr @__TVMBackendAllocWorkspace" not in ll, "the accumulator tile went to a workspace"


def test_run_time_weight_is_not_prefetched():
    """A weight that is a parameter stays (K, N) and is read in place: its next columns are not its next bytes."""
    w, b = _weights()
    target = resolve_target(TARGET)
    scheduled = _scheduled(_dense([1, 24, K], w, b, weight_param=True), target)
    assert not any("T.prefetch" in s for s in _kernel_scripts(InsertWeightPrefetch()(scheduled)))
    vm = relax.VirtualMachine(finalize(_scheduled(_dense([1, 24, K], w, b, weight_param=True),
                                                  resolve_target("llvm")), resolve_target("llvm")), tvm.cpu())
    x = np.random.default_rng(1).standard_normal((1, 24, K)).astype("float32")
    out = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    np.testing.assert_allclose(out, _gelu(x.astype("float64") @ w + b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", ["static", "symbolic"])
def test_gated_dense_prefetches_both_halves_of_the_next_panel(rows):
    """The gated weight is packed (N/nr, K, nr, 2): a panel row is gate and up side by side, 2·nr floats."""
    from tvm_fusion_ext.ops.gated_dense import interleave_weights
    from tvm_fusion_ext.testing import numpy_activation

    rng = np.random.default_rng(3)
    wg, wu = ((rng.standard_normal((K, N)) / np.sqrt(K)).astype("float32") for _ in range(2))
    shape = [1, 24, K] if rows == "static" else [tirx.Var("batch", "int64"), tirx.Var("seq", "int64"), K]
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    mod = build_module([x], lambda bb: bb.emit(call_op(bb, "fused_gated_dense", {
        "x": x, "w": relax.const(interleave_weights(wg, wu)), "bias": None}, {"act": "silu"})))
    target = resolve_target("llvm")
    scheduled = _scheduled(mod, target)
    prefetches = [line for s in _kernel_scripts(InsertWeightPrefetch()(scheduled)) for line in s.splitlines()
                  if "T.prefetch" in line]
    assert prefetches, "no prefetch in the gated kernel"
    vm = relax.VirtualMachine(finalize(scheduled, target), tvm.cpu())
    xs = rng.standard_normal((1, 24, K)).astype("float32")
    out = vm["main"](tvm.runtime.tensor(xs)).numpy()
    x64 = xs.astype("float64")
    np.testing.assert_allclose(out, numpy_activation(x64 @ wg, "silu") * (x64 @ wu), rtol=1e-4, atol=1e-4)
