"""CPU template for ``fused_layernorm``: one parallel loop over rows, everything else computed per row.

Per row: ``h = x (+ residual) (+ bias)`` is formed once into a row buffer (it stays in L1), the sum and the
squared deviations are vectorised reductions over that buffer (rfactor into ``lanes`` partial sums, then a
short horizontal add), and the normalised output is written with vector stores. Rows whose length is not a
multiple of the vector width keep scalar reductions and loops (still one parallel task per row).

Knobs: ``unroll``: index into :data:`UNROLL_STEPS` (``sample_categorical``). The vector width comes from
the target, not from the search.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import tvm
from tvm import s_tir

from ...targets import TargetInfo
from ..common import row_loop
from ..rule import Knobs, TemplateRule, root_blocks

UNROLL_STEPS = (0, 16, 64)


def _split_vector(sch: s_tir.Schedule, loop, lanes: int):
    """(outer, inner) with an exact ``lanes``-wide inner loop, or None when the extent does not allow one."""
    extent = int(sch.get(loop).extent)
    if extent == lanes:
        return None, loop
    if extent % lanes:
        return None
    return tuple(sch.split(loop, [None, lanes]))


def _rfactor_lanes(sch: s_tir.Schedule, block, lanes: int):
    """Split ``block``'s reduction into ``lanes`` partial sums (an rf block); None when the row is too short
    or not a multiple of ``lanes``. Must run while the block is still at the root (rfactor's requirement)."""
    loop = sch.get_loops(block)[-1]
    extent = int(sch.get(loop).extent)
    if extent % lanes or extent <= lanes:
        return None
    _, inner = sch.split(loop, [None, lanes])
    n_spatial = len(sch.get_loops(block)) - 2
    return sch.rfactor(inner, n_spatial)


def _vectorise_rf(sch: s_tir.Schedule, rf) -> None:
    # Under the row loop the rf block's loops are (row, lane, unit loops..., outer reduction): make the lane
    # axis innermost so that each step adds one vector of the row into ``lanes`` partial sums.
    loops = sch.get_loops(rf)
    lane, outer = loops[1], loops[-1]
    sch.reorder(outer, lane)
    sch.vectorize(lane)
    sch.decompose_reduction(rf, outer)


def layernorm_cpu(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, target: tvm.target.Target,
                  knobs: Optional[dict] = None) -> None:
    knobs = knobs or {}
    lanes = TargetInfo.of(target).lanes()
    blocks = root_blocks(sch)
    row_input, stats, out = block, [b for b in blocks[1:-1]], blocks[-1]

    rfs = [_rfactor_lanes(sch, stat, lanes) for stat in stats]
    row, n = row_loop(sch, out)
    sch.parallel(row)
    vec = _split_vector(sch, n, lanes)
    if vec is not None:
        sch.vectorize(vec[1])

    # Consumers first, so every producer lands under the row loop ahead of its consumers.
    producers = [row_input]
    for stat, rf in zip(stats, rfs):
        producers += [rf, stat] if rf is not None else [stat]
    for producer in reversed(producers):
        sch.compute_at(producer, row, preserve_unit_loops=True)

    vec = _split_vector(sch, sch.get_loops(row_input)[-1], lanes)
    if vec is not None:
        sch.vectorize(vec[1])
    for rf in rfs:
        if rf is not None:
            _vectorise_rf(sch, rf)

    u = sch.sample_categorical(list(UNROLL_STEPS), [1.0 / len(UNROLL_STEPS)] * len(UNROLL_STEPS),
                               decision=knobs.get("unroll", 1))
    sch.annotate(row, "pragma_auto_unroll_max_step", u)
    sch.annotate(row, "pragma_unroll_explicit", 1)


@dataclass(frozen=True)
class LayerNormCpuKnobs(Knobs):
    unroll: Optional[int] = None            # index into UNROLL_STEPS


class LayerNormCPU(TemplateRule):
    """``fused_layernorm`` on CPU: one parallel task per row, vectorised statistics."""

    block_rule = "tfx.layernorm"
    family = "cpu"
    Knobs = LayerNormCpuKnobs

    def decline(self, sch, block, target):
        # rows (batch × sequence) may be symbolic: they are the parallel loop; the row width may not
        width = sch.get(sch.get_loops(block)[-1]).extent
        return None if isinstance(width, tvm.tirx.IntImm) else f"row width {width} is symbolic"

    def transferable_knobs(self, static):
        """``unroll``: the schedule is per row whatever the row count."""
        return {k: v for k, v in static.items() if k == "unroll"}

    def schedule(self, sch, block, target, knobs=None):
        layernorm_cpu(sch, block, target, knobs)
