"""Software prefetch of the next weight panel in a CPU GEMM: the next task's weights arrive while this one computes.

A packed dense kernel's task streams its column panels of W once, for its first row tile, and re-reads them from
L2 for the others. A model's weights do not fit the cache (MiniLM: 42 MB of projections per call against a 32 MB
L3), so the first row tile of every task waits on DRAM: at 48 rows a 49 KB panel must arrive in the ~10 µs that
row tile computes (~30 GB/s, more than one core of this host streams: 21–24 GB/s measured), while the other row
tiles ask nothing of memory. Twenty-four chained MiniLM FFN layers (57 MB of weights) ran 1.17× slower at 48 rows
with distinct weights than with one shared pair (1.27× at 16 rows, 1.04× at 128).

Contract with the templates: the loop of a kernel's k steps is annotated :data:`PREFETCH_KEY` =
``"BUFFER:AHEAD"``: BUFFER is the packed weight (N/nr, K, nr, ...) its block reads, AHEAD how many panels further on
this thread's next task reads the same panel position (a task's panels are consecutive in memory, and TVM's
static chunking gives a thread consecutive tasks). :func:`InsertWeightPrefetch`, on the scheduled module before
lowering, puts at the top of that loop one ``llvm.prefetch`` (into L2) per cache line of the same k row of the
panel AHEAD on. ``llvm.prefetch`` never faults, so the last task's look past the end of W is harmless.

A call inside the k loop (the prefetch is one) keeps LLVM from holding an accumulator tile in registers when
TVM allocated the tile as a workspace (every "local" buffer on CPU): it cannot prove the call leaves that pointer
alone (measured: every kernel 2.1–2.3× slower). :func:`StackAccumulators`, the last pass of the TIR pipeline this
package compiles CPU modules with (:data:`TIR_PIPELINE`), keeps small local buffers on the stack, where LLVM
promotes them to registers whatever the loop calls. Prefetching a slice of the next panel in a burst before each
k loop instead (no call inside it) was slower than no prefetch at all.
"""

from __future__ import annotations

import math
from typing import List

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ...schedules.common import PREFETCH_KEY
from ...tir_nodes import collect, substitute

#: bytes per cache line on every x86-64 and Arm64 host we target
LINE_BYTES = 64
#: ``llvm.prefetch`` locality 2: into L2, not L1; the next panel is needed a task later, not at the next k
LOCALITY_L2 = 2


def _weight_load(realize, name: str):
    # 0.27's BufferLoad constructor builds an ``ir.TensorLoad``, whose buffer is ``source``
    loads = [ld for ld in collect(realize.block.body, tvm.ir.expr.TensorLoad) if str(ld.source.name) == name]
    return loads[0] if loads else None


def _prefetches(loop: tirx.For) -> List[tirx.Stmt]:
    """One prefetch per cache line of the panel row AHEAD panels on; the loops inside ``loop`` (the unrolled rows,
    the vector lanes) at their first iteration. Empty when the annotated buffer is not read there as a packed
    weight: (panels, K, lanes...) with static lanes."""
    name, _, ahead = str(loop.annotations[PREFETCH_KEY]).rpartition(":")
    inner_at_first = {inner.loop_var: inner.min for inner in collect(loop.body, tirx.For)}
    for realize in collect(loop.body, s_tir.SBlockRealize):
        load = _weight_load(realize, name)
        buf = load.source if load is not None else None
        if buf is None or len(buf.shape) < 3 or not all(isinstance(d, tirx.IntImm) for d in buf.shape[2:]):
            continue
        block_vars = {iv.var: value for iv, value in zip(realize.block.iter_vars, realize.iter_values)}
        panel, k, *first = (substitute(substitute(i, block_vars), inner_at_first) for i in load.indices)
        lanes = [int(d) for d in buf.shape[2:]]
        per_line = max(1, LINE_BYTES // (tvm.DataType(buf.dtype).bits // 8))
        out = []
        for elem in range(0, math.prod(lanes), per_line):
            tail = []
            for extent in reversed(lanes):  # the row-major position of ``elem`` in the lanes
                tail.insert(0, elem % extent)
                elem //= extent
            out.append(tirx.Evaluate(tirx.call_intrin("void", "tirx.prefetch", tirx.address_of(tirx.BufferLoad(
                buf, [panel + int(ahead), k] + [f + t for f, t in zip(first, tail)])), 0, LOCALITY_L2, 1)))
        return out
    return []


def annotated_loop_pass(name: str, key: str, prefix) -> tvm.transform.Pass:
    """Module pass: every loop annotated with ``key`` gets ``prefix(loop, func)`` (statements) at the top of its
    body, and loses the annotation. The prefetch passes' common walk."""

    @tvm.transform.module_pass(opt_level=0, name=name)
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        out = None
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc):
                continue

            def rewrite(stmt, func=func):
                if not (isinstance(stmt, tirx.For) and stmt.annotations is not None and key in stmt.annotations):
                    return stmt
                annotations = {k: v for k, v in stmt.annotations.items() if k != key}
                stmts = prefix(stmt, func)
                body = tirx.SeqStmt(stmts + [stmt.body]) if stmts else stmt.body
                return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding,
                                annotations, stmt.step, stmt.span)

            body = tvm_ffi.structural_map(func.body, (tirx.For, rewrite))
            if not body.same_as(func.body):
                out = out if out is not None else mod.clone()
                out[gv] = func.with_body(body)
        return out if out is not None else mod

    return _pass


#: accumulator tiles up to this size stay on the stack (TVM puts every "local" buffer in a workspace otherwise)
STACK_TILE_BYTES = 4096


def _stack_accumulators(func):
    # ``disable_lower_builtin`` on an allocation: LowerTVMBuiltin leaves it a stack alloca
    def mark(alloc):
        buf = alloc.buffer
        if str(buf.scope()) != "local" or not all(isinstance(e, tirx.IntImm) for e in buf.shape):
            return alloc
        if math.prod(int(e) for e in buf.shape) * tvm.DataType(buf.dtype).bits // 8 > STACK_TILE_BYTES:
            return alloc
        ann = dict(alloc.annotations) if alloc.annotations is not None else {}
        ann["disable_lower_builtin"] = tvm.tirx.IntImm("int32", 1)
        return tirx.AllocBuffer(buf, annotations=ann)

    return func.with_body(tvm_ffi.structural_map(func.body, (tirx.AllocBuffer, mark)))


def StackAccumulators() -> tvm.transform.Pass:  # noqa: N802
    """Small local buffers (accumulator tiles) become stack allocas: LLVM then keeps them in registers whatever
    calls their loop holds (a prefetch is one); a workspace pointer it must prove unaliased first."""

    @tvm.transform.module_pass(opt_level=0, name="tfx.StackAccumulators")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        out = mod.clone()
        for gv, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc):
                out[gv] = _stack_accumulators(func)
        return out

    return _pass


def _tfx_pipeline(**kwargs):
    main, host, device = tvm.tirx.get_tir_pipeline("s_tir", **kwargs)
    return tvm.transform.Sequential([main, StackAccumulators()]), host, device


TIR_PIPELINE = "tfx_cpu"
tvm.tirx.register_tir_pipeline(TIR_PIPELINE, _tfx_pipeline)


def InsertWeightPrefetch() -> tvm.transform.Pass:  # noqa: N802
    """Module pass: every loop annotated with :data:`PREFETCH_KEY` gets its prefetches (see the module doc)."""
    return annotated_loop_pass("tfx.InsertWeightPrefetch", PREFETCH_KEY, lambda loop, _func: _prefetches(loop))
