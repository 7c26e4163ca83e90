"""CPU template for ``fused_quantize_rows``: one parallel task per row, everything of a row computed in it.

Per row: the row input (smoothed when asked) is formed once into a one-row buffer, the minimum and the maximum
are vectorised reductions over it (rfactored into ``lanes`` partial results, then a
short horizontal step, as the LayerNorm template's statistics), the scale and zero point are scalars, and ``q``
is written with vector stores (division, round, clip and the narrowing cast on a vector). The row (K floats)
stays in L1 between its three passes, so the activation is read from memory once and ``q`` written once. Rows
whose length is not a multiple of the vector width keep scalar reductions and loops.

Knobs: ``unroll``: index into :data:`~.layernorm.UNROLL_STEPS`. The vector width comes from the target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import tvm
from tvm import s_tir

from ...targets import TargetInfo
from ..rule import Knobs, TemplateRule, root_blocks
from .layernorm import UNROLL_STEPS, _rfactor_lanes, _split_vector


def quantize_rows_cpu(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, target: tvm.target.Target,
                      knobs: Optional[dict] = None) -> None:
    knobs = knobs or {}
    lanes = TargetInfo.of(target).lanes()
    named = {sch.get(b).name_hint: b for b in root_blocks(sch)}
    stats = [named["qr_min"], named["qr_max"]]
    scale, zero, q = (named[n] for n in ("qr_scale", "qr_zero", "qr_q"))

    rfs = [_rfactor_lanes(sch, stat, lanes) for stat in stats]
    # The row loop is the row input's (scale and zero point are outputs: compute_at refuses them, so every
    # later block is moved under it as a consumer, in order).
    *rows, k = sch.get_loops(block)
    row = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    later = []
    for stat, rf in zip(stats, rfs):
        later += [rf, stat] if rf is not None else [stat]
    for consumer in later + [scale, zero, q]:
        sch.reverse_compute_at(consumer, row, preserve_unit_loops=True)
    sch.parallel(row)

    for b in (block, q):
        vec = _split_vector(sch, sch.get_loops(b)[-1], lanes)
        if vec is not None:
            sch.vectorize(vec[1])
    for rf in rfs:
        if rf is not None:
            _vectorise_lanes(sch, rf)

    u = sch.sample_categorical(list(UNROLL_STEPS), [1.0 / len(UNROLL_STEPS)] * len(UNROLL_STEPS),
                               decision=knobs.get("unroll", 1))
    sch.annotate(row, "pragma_auto_unroll_max_step", u)
    sch.annotate(row, "pragma_unroll_explicit", 1)


def _vectorise_lanes(sch: s_tir.Schedule, rf) -> None:
    # Moved under the row loop, the rf block's loops follow its block iters (row, lane, unit loops..., outer
    # reduction): the lane axis goes innermost, so each step folds one vector of the row into ``lanes`` partials.
    loops = sch.get_loops(rf)
    lane, outer = loops[1], loops[-1]
    sch.reorder(outer, lane)
    sch.vectorize(lane)
    sch.decompose_reduction(rf, outer)


@dataclass(frozen=True)
class QuantizeRowsCpuKnobs(Knobs):
    unroll: Optional[int] = None            # index into UNROLL_STEPS


class QuantizeRowsCPU(TemplateRule):
    """``fused_quantize_rows`` on CPU: one parallel task per row, vectorised range and quantisation."""

    block_rule = "tfx.quantize_rows"
    family = "cpu"
    Knobs = QuantizeRowsCpuKnobs

    def decline(self, sch, block, target):
        # rows may be symbolic (they are the parallel loop); the row width may not
        width = sch.get(sch.get_loops(block)[-1]).extent
        return None if isinstance(width, tvm.tirx.IntImm) else f"row width {width} is symbolic"

    def transferable_knobs(self, static):
        """``unroll``: the schedule is per row whatever the row count."""
        return {k: v for k, v in static.items() if k == "unroll"}

    def schedule(self, sch, block, target, knobs=None):
        quantize_rows_cpu(sch, block, target, knobs)
