"""Schedule helpers every target family uses."""

from __future__ import annotations

import json
from typing import List, Optional, Sequence

import tvm
from tvm import s_tir


#: loop annotation "BUFFER:AHEAD" on a GEMM's k-step loop: each step prefetches its row of the packed weight
#: panel AHEAD panels on (compile/codegen/weight_prefetch.py inserts the prefetches)
PREFETCH_KEY = "tfx.prefetch_weight"
#: loop annotation: rows of named buffers to prefetch ahead of each iteration (compile/codegen/row_prefetch.py)
ROW_PREFETCH_KEY = "tfx.prefetch_rows"


def prefetch_annotation(buffer_name: str, panels_ahead: int) -> str:
    return f"{buffer_name}:{int(panels_ahead)}"


def row_prefetch_annotation(rows) -> str:
    """The :data:`ROW_PREFETCH_KEY` value for ``[(buffer name, rows ahead), ...]``."""
    return ",".join(f"{name}+{int(ahead)}" for name, ahead in rows)


def inline_consumers(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> None:
    """Reverse-inline the elementwise chain after ``block`` (our epilogue, plus anything fused after it)."""
    while True:
        consumers = sch.get_consumers(block)
        if len(consumers) != 1:
            return
        try:
            sch.reverse_compute_inline(consumers[0])
        except s_tir.ScheduleError:
            return


def op_params(sch: s_tir.Schedule) -> dict:
    """The fused operator's parameters (``tfx.params``) of the scheduled PrimFunc; empty for other kernels."""
    attrs = sch.mod["main"].attrs
    return json.loads(str(attrs["tfx.params"])) if attrs is not None and "tfx.params" in attrs else {}


def static_extents_reason(sch: s_tir.Schedule, named_loops) -> str | None:
    """Why a template cannot take these ``(name, loop)`` pairs: the first whose extent is symbolic, or None."""
    for name, loop in named_loops:
        if not isinstance(sch.get(loop).extent, tvm.tirx.IntImm):
            return f"{name} extent {sch.get(loop).extent} is symbolic"
    return None


def has_symbolic_rows(call) -> bool:
    """Whether a dense-like operator's rows (the leading dims of its ``x``) are known only at run time."""
    return not all(isinstance(d, tvm.tirx.IntImm) for d in call.inputs["x"].ty.shape.values[:-1])


def pad_symbolic_rows(call, op: str, row_block: int):
    """``call`` asking its operator to pad run-time rows to ``row_block``; None for another operator, static
    rows, or rows already padded."""
    if call.op != op or call.params.get("row_block") is not None or not has_symbolic_rows(call):
        return None
    return call.replace(params={**call.params, "row_block": int(row_block)})


def padded_rows_stage(sch: s_tir.Schedule, block):
    """The ``dense_rows`` producer of a dense whose symbolic rows the operator padded (``row_block``), or None."""
    for producer in sch.get_producers(block):
        if sch.get(producer).name_hint == "dense_rows":
            return producer
    return None


def divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def largest_divisor(n: int, cap: int) -> int:
    return max(d for d in divisors(n) if d <= max(cap, 1))


def row_loop(sch: s_tir.Schedule, block):
    """``(rows, last)``: the block's leading loops fused into one row loop (a unit loop for a single row)."""
    *rows, last = sch.get_loops(block)
    if not rows:
        rows = [sch.add_unit_loop(last)]
    return (sch.fuse(*rows) if len(rows) > 1 else rows[0]), last


def categorical(sch: s_tir.Schedule, candidates, knob: str, default, knobs):
    """A categorical sample; its knob is the candidate *index* (what MetaSchedule records)."""
    decision = (knobs or {}).get(knob, list(candidates).index(default))
    return sch.sample_categorical(list(candidates), [1.0 / len(candidates)] * len(candidates), decision=decision)


def knob_decision(given: Optional[Sequence[int]], default: List[int]) -> List[int]:
    """A tile's ``sample_perfect_tile`` decision: the factors a knob gives (as ints), else the template's."""
    return [int(v) for v in given] if given is not None else default


def flatten_rows_map(batch_shape, extra: int, index_dtype: str):
    """IndexMap ``(*batch, *rest) -> (flat row, *rest)``, the ``extra`` trailing axes kept as they are.

    Unit batch axes contribute nothing and are left out of the row expression: with a symbolic axis beside
    them (``[1, seq]``), TVM's bijectivity check refuses a map that still multiplies by ``seq``."""
    from tvm.tirx import IndexMap

    def fn(*iv):
        row = None
        for d, v in zip(batch_shape, iv[:len(batch_shape)]):
            if isinstance(d, int) and d == 1 or isinstance(d, tvm.tirx.IntImm) and int(d) == 1:
                continue
            row = v if row is None else row * d + v
        return (row if row is not None else iv[0] * 0, *iv[len(batch_shape):])

    return IndexMap.from_func(fn, ndim=len(batch_shape) + extra, index_dtype=index_dtype)


def flatten_block_rows(sch: s_tir.Schedule, block, extra: int):
    """Make the block's batch axes one row axis in its iteration space (not just its loops); returns its loops.

    Tiles of a fused loop are then rectangles in (row, col); with only fused loops, a tile straddling two batch
    entries would have a bounding-box region that overlaps the next tile."""
    loops = sch.get_loops(block)
    batch = loops[: len(loops) - extra]
    if len(batch) == 1:
        return loops
    if not batch:
        sch.add_unit_loop(loops[0])
        return sch.get_loops(block)
    shape = [sch.get(lp).extent for lp in batch]
    sch.transform_block_layout(block, flatten_rows_map(shape, extra, str(sch.get(loops[-1]).extent.ty)))
    return sch.get_loops(block)


def flatten_write_rows(sch: s_tir.Schedule, block) -> None:
    """Give the block's output buffer one row axis, so that a thread's or a block's tile of it is a rectangle
    (a register tile indexed through (batch, seq) bounding boxes would be addressed dynamically)."""
    buf = sch.get(block).writes[0].source
    if len(buf.shape) <= 2:
        return
    sch.transform_layout(block, ("write", 0), flatten_rows_map(list(buf.shape[:-1]), 1, str(buf.shape[0].ty)))
