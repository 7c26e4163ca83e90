"""Schedule helpers every target family uses."""

from __future__ import annotations

from typing import List

from tvm import s_tir


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
