"""Software prefetch of rows a loop reads one after another: a decode attention's K and V rows.

A decode attention task reads its keys' K rows, then their V rows, a few KB at a time, with a little arithmetic
on each; the hardware prefetcher, which starts over on every task's short run of rows, leaves the loads waiting
on L3 or DRAM. Measured on the 2-core Zen 3 VM with the q·kᵀ loop alone in C over a batch-4, 2048-position cache
(16.8 MB, the rows in the kernel's task order): 43 cycles a row without prefetch, 35 with rows 8 ahead, 28 with
rows 16 ahead; a cache that fits L2 gained nothing.

Contract with the templates: the loop over a kernel's rows is annotated :data:`ROW_PREFETCH_KEY` =
``"NAME+AHEAD,..."`` (``"k+16,v+0"``). The first NAME is the buffer that loop's block reads one row per iteration;
later ones name other buffers the kernel reads, of the same shape, prefetched at the same indices (V beside K).
AHEAD is how many rows on. A row is the buffer's last dim (a head's elements, whatever the layout).
:func:`InsertRowPrefetch`, on the scheduled module before lowering, puts at the top of that loop one
``llvm.prefetch`` (into L1) per cache line of each named row. ``llvm.prefetch`` never faults, so a look past the
end of a buffer is harmless; the loop's inner loops (the row's elements, the vector lanes) hold no call, so their
accumulators stay in registers.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ...schedules.common import ROW_PREFETCH_KEY
from ...tir_nodes import collect, substitute
from .weight_prefetch import LINE_BYTES, annotated_loop_pass

#: ``llvm.prefetch`` locality 3: into L1, the row is read a few iterations later
LOCALITY_L1 = 3


def _parse(value: str) -> List[Tuple[str, int]]:
    out = []
    for item in str(value).split(","):
        name, _, ahead = item.rpartition("+")
        out.append((name, int(ahead)))
    return out


def _prefetches(loop: tirx.For, buffers: Dict[str, tirx.Buffer]) -> List[tirx.Stmt]:
    """Prefetches of each named row AHEAD iterations of ``loop`` on, its inner loops at their first iteration.
    Empty when the first name is not read in ``loop`` with the loop's variable in an index before the last, or
    has no static last dim."""
    rows = _parse(loop.annotations[ROW_PREFETCH_KEY])
    first_name = rows[0][0]
    inner_at_first = {inner.loop_var: inner.min for inner in collect(loop.body, tirx.For)}
    for realize in collect(loop.body, s_tir.SBlockRealize):
        loads = [ld for ld in collect(realize.block.body, tvm.ir.expr.TensorLoad)
                 if str(ld.source.name) == first_name]
        if not loads:
            continue
        buf = loads[0].source
        if len(buf.shape) < 2 or not isinstance(buf.shape[-1], tirx.IntImm):
            return []
        block_vars = {iv.var: value for iv, value in zip(realize.block.iter_vars, realize.iter_values)}
        indices = [substitute(substitute(i, block_vars), inner_at_first) for i in loads[0].indices]
        if not any(v.same_as(loop.loop_var) for i in indices[:-1] for v in tirx.analysis.undefined_vars(i)):
            return []
        per_line = max(1, LINE_BYTES // (tvm.DataType(buf.dtype).bits // 8))
        lines = -(-int(buf.shape[-1]) // per_line)
        out = []
        for name, ahead in rows:
            target = buffers.get(name) if name != first_name else buf
            if target is None or len(target.shape) != len(buf.shape) or str(target.dtype) != str(buf.dtype) \
                    or not all(tvm_ffi.structural_equal(a, b) for a, b in zip(target.shape[1:], buf.shape[1:])):
                continue
            at = [substitute(i, {loop.loop_var: loop.loop_var + ahead}) for i in indices]
            for line in range(lines):
                head = at[:-1] + [tirx.IntImm(str(at[-1].ty), line * per_line)]
                out.append(tirx.Evaluate(tirx.call_intrin("void", "tirx.prefetch", tirx.address_of(
                    tirx.BufferLoad(target, head)), 0, LOCALITY_L1, 1)))
        return out
    return []


def InsertRowPrefetch() -> tvm.transform.Pass:  # noqa: N802
    """Module pass: every loop annotated with :data:`ROW_PREFETCH_KEY` gets its prefetches (see the module doc)."""
    return annotated_loop_pass("tfx.InsertRowPrefetch", ROW_PREFETCH_KEY,
                               lambda loop, func: _prefetches(loop, _buffers_read(func)))


def _buffers_read(func: tirx.PrimFunc) -> Dict[str, tirx.Buffer]:
    buffers: Dict[str, tirx.Buffer] = {}
    for load in collect(func.body, tvm.ir.expr.TensorLoad):
        buffers.setdefault(str(load.source.name), load.source)
    return buffers
