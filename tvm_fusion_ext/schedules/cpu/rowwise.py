"""What the CPU templates of row-wise operators share (LayerNorm and RMSNorm, int8's row quantisation): one
parallel task per row, the row's reductions split into ``lanes`` partial results that vector instructions fold,
and one knob, the unroll depth of the per-row body.

Rows (batch × sequence) may be symbolic, since they are the parallel loop; the row width may not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import tvm
from tvm import s_tir

from ..rule import Knobs, TemplateRule

UNROLL_STEPS = (0, 16, 64)


def split_vector(sch: s_tir.Schedule, loop, lanes: int):
    """(outer, inner) with an exact ``lanes``-wide inner loop, or None when the extent does not allow one."""
    extent = int(sch.get(loop).extent)
    if extent == lanes:
        return None, loop
    if extent % lanes:
        return None
    return tuple(sch.split(loop, [None, lanes]))


def rfactor_lanes(sch: s_tir.Schedule, block, lanes: int):
    """Split ``block``'s reduction into ``lanes`` partial results (an rf block); None when the row is too short
    or not a multiple of ``lanes``. Must run while the block is still at the root (rfactor's requirement)."""
    loop = sch.get_loops(block)[-1]
    extent = int(sch.get(loop).extent)
    if extent % lanes or extent <= lanes:
        return None
    _, inner = sch.split(loop, [None, lanes])
    n_spatial = len(sch.get_loops(block)) - 2
    return sch.rfactor(inner, n_spatial)


def vectorise_rf(sch: s_tir.Schedule, rf) -> None:
    """Under the row loop the rf block's loops are (row, lane, unit loops..., outer reduction): the lane axis goes
    innermost, so that each step folds one vector of the row into ``lanes`` partial results."""
    loops = sch.get_loops(rf)
    lane, outer = loops[1], loops[-1]
    sch.reorder(outer, lane)
    sch.vectorize(lane)
    sch.decompose_reduction(rf, outer)


def vectorise_row_loops(sch: s_tir.Schedule, blocks, rfs, lanes: int) -> None:
    """Each of ``blocks``' innermost loop in ``lanes``-wide vectors where its extent allows, and every rf block's
    partial results (:func:`vectorise_rf`)."""
    for block in blocks:
        vec = split_vector(sch, sch.get_loops(block)[-1], lanes)
        if vec is not None:
            sch.vectorize(vec[1])
    for rf in rfs:
        if rf is not None:
            vectorise_rf(sch, rf)


def annotate_unroll(sch: s_tir.Schedule, row, knobs: dict) -> None:
    u = sch.sample_categorical(list(UNROLL_STEPS), [1.0 / len(UNROLL_STEPS)] * len(UNROLL_STEPS),
                               decision=knobs.get("unroll", 1))
    sch.annotate(row, "pragma_auto_unroll_max_step", u)
    sch.annotate(row, "pragma_unroll_explicit", 1)


@dataclass(frozen=True)
class RowwiseCpuKnobs(Knobs):
    unroll: Optional[int] = None            # index into UNROLL_STEPS


class RowwiseCPU(TemplateRule):
    """Base of the row-wise CPU templates: subclasses name their ``block_rule`` and ``schedule``."""

    family = "cpu"
    Knobs = RowwiseCpuKnobs

    def decline(self, sch, block, target):
        width = sch.get(sch.get_loops(block)[-1]).extent
        return None if isinstance(width, tvm.tirx.IntImm) else f"row width {width} is symbolic"

    def transferable_knobs(self, static):
        """``unroll``: the schedule is per row whatever the row count."""
        return {k: v for k, v in static.items() if k == "unroll"}
