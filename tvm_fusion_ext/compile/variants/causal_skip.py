"""Causal attention skips the key blocks no query of a tile can see.

A causal ``fused_attention`` (key ``j`` visible to query ``i`` iff ``j <= i + T - S``) folds key blocks into
its online softmax in one loop (``attn_online``'s reduction over key blocks). Blocks past the diagonal of a
query tile contribute exactly nothing: every score is -inf, so the block's max is the lowest finite value, its
sum and numerator 0, and the fold leaves the running state unchanged bit for bit. This pass bounds that loop
by the last block the tile's last row can see, ``(i_max + T - S) // key_block + 1``, so about half the work
of a long causal prefill is never done.

It runs on the *scheduled* kernel, whichever schedule made it (template defaults, tuning records, a fallback):
``i_max`` is the largest query row the loop body handles, worked out from the update block's row binding with
every loop inside the key-block loop (and every thread-bound loop, so a GPU thread block agrees on the bound)
relaxed to its range. A kernel whose structure is not recognised is left unchanged, which is always correct:
the bound is an optimisation, the per-key causal test inside the kernel is the semantics.
"""

from __future__ import annotations

from typing import List, Optional

import tvm
import tvm_ffi
from tvm import tirx

from ...ops.attention import key_geometry
from ...ops.registry import inputs_of, op_of, params_of

_UPDATE_BLOCK = "attn_online_update"
_ROW_AXIS = 2  # attn_online's block variables are (b, h, i, d, key block)


def SkipMaskedKeyBlocks() -> tvm.transform.Pass:  # noqa: N802  (TVM pass naming)
    """Module pass: bound the key-block loop of every scheduled causal ``fused_attention`` by its query tile."""

    @tvm.transform.module_pass(opt_level=0, name="tfx.SkipMaskedKeyBlocks")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        out = None
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or op_of(func) != "fused_attention":
                continue
            if not params_of(func).get("causal") and "cu_seqlens" not in inputs_of(func):  # nothing to bound
                continue
            new = bound_key_block_loop(func)
            if new is not None:
                out = out if out is not None else mod.clone()  # a Python module pass gets the caller's module
                out[gv] = new
        return out if out is not None else mod

    return _pass


def bound_key_block_loop(func: tirx.PrimFunc) -> Optional[tirx.PrimFunc]:
    """``func`` with its key-block loop bounded by the query tile, or None when the structure is not found."""
    found = _find_update(func.body, [])
    if found is None:
        return None
    realize, loops = found
    block = realize.block
    reduce_axes = [n for n, iv in enumerate(block.iter_vars) if int(iv.iter_type) == 2]  # CommReduce
    if len(reduce_axes) != 1 or len(block.iter_vars) != 5:
        return None
    rb_value = realize.iter_values[reduce_axes[0]]
    position = next((n for n, lp in enumerate(loops) if lp.loop_var.same_as(rb_value)), None)
    if position is None:
        return None  # the key-block axis is not one plain loop (split, fused): leave it
    rb_loop = loops[position]
    relaxed = {lp.loop_var: tvm.sym.IntervalSet(lp.min, lp.min + lp.extent - 1)
               for n, lp in enumerate(loops) if n > position or _thread_bound(lp)}
    analyzer = tvm.sym.Analyzer()
    rows = analyzer.int_set(realize.iter_values[_ROW_AXIS], relaxed)
    i_max = rows.max_value
    if any(v.same_as(rb_loop.loop_var) for v in tirx.analysis.undefined_vars(i_max)) or _unbounded(i_max):
        return None
    S, T, kb = key_geometry(func)
    dtype = str(rb_loop.extent.ty)
    c = lambda v: tirx.const(v, dtype)  # noqa: E731
    visible_blocks = rb_loop.extent + rb_loop.min
    if params_of(func).get("causal"):
        offset = T - S  # the diagonal's shift; symbolic (and usually 0) when the lengths are
        offset = c(offset) if isinstance(offset, int) else offset.astype(dtype)
        visible_blocks = tirx.floordiv(i_max.astype(dtype) + offset, c(kb)) + c(1)
    # packed attention whose longest length is known only at run time (RemovePadding's): a static key-block loop
    # keeps its constant extent (nvcc keeps its per-thread arrays in registers only for those)
    if "cu_seqlens" in inputs_of(func) and not isinstance(rb_loop.extent, tirx.IntImm):
        i_min = rows.min_value
        if any(v.same_as(rb_loop.loop_var) for v in tirx.analysis.undefined_vars(i_min)) or _unbounded(i_min):
            return None
        visible_blocks = tirx.min(visible_blocks, _sequence_blocks(func, i_min, i_max, kb, dtype))
    extent = tirx.max(c(0), tirx.min(rb_loop.extent, visible_blocks - rb_loop.min))
    extent = analyzer.simplify(extent)

    def bound(loop):
        if not loop.loop_var.same_as(rb_loop.loop_var):
            return loop
        return tirx.For(loop.loop_var, loop.min, extent, loop.kind, loop.body, loop.thread_binding,
                        loop.annotations)

    return func.with_body(tvm_ffi.structural_map(func.body, (tirx.For, bound)))


def _sequence_blocks(func: tirx.PrimFunc, i_min, i_max, kb: int, dtype: str):
    """Packed attention: key blocks the rows ``[i_min, i_max]`` can see. They belong to sequences
    ``row_seq[i_min] .. row_seq[i_max]``, each no longer than the rows those sequences span together,
    ``cu[row_seq[i_max] + 1] - cu[row_seq[i_min]]`` (exactly the length when the tile lies in one sequence)."""
    params = dict(zip(inputs_of(func), func.params))  # 0.27: a parameter is loaded from; its type is its buffer
    cu, row_seq = params["cu_seqlens"], params["row_seq"]
    last = row_seq.ty.shape[0] - 1  # rows past the end (the query-tile padding) read the last row
    index = str(last.ty)

    def seq_of(i):
        return tirx.BufferLoad(row_seq, [tirx.min(i.astype(index), last)]).astype(index)

    def start(n):
        return tirx.BufferLoad(cu, [n]).astype(dtype)

    span = start(seq_of(i_max) + tirx.const(1, index)) - start(seq_of(i_min))
    return tirx.floordiv(span + tirx.const(kb - 1, dtype), tirx.const(kb, dtype))


def _thread_bound(loop) -> bool:
    if loop.thread_binding is None:
        return False
    tag = str(loop.thread_binding.thread_tag)
    return tag.startswith("threadIdx") or tag.startswith("vthread")


def _unbounded(expr) -> bool:
    text = str(expr)
    return "inf" in text  # IntSet gives pos_inf/neg_inf when a variable has no range


def _find_update(stmt, loops: List[tirx.For]):
    """(the update block's realize, the loops around it, outermost first), or None."""
    if isinstance(stmt, tvm.s_tir.SBlockRealize):
        if stmt.block.name_hint == _UPDATE_BLOCK:
            return stmt, loops
        return _find_update(stmt.block.body, loops)
    if isinstance(stmt, tirx.For):
        return _find_update(stmt.body, loops + [stmt])
    children = []
    for name in ("body", "then_case", "else_case"):
        child = getattr(stmt, name, None)
        if isinstance(child, tirx.Stmt):
            children.append(child)
    children.extend(getattr(stmt, "seq", None) or [])
    for child in children:
        found = _find_update(child, loops)
        if found is not None:
            return found
    return None
