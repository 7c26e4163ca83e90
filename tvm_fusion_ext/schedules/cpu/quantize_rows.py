"""CPU template for ``fused_quantize_rows``: one parallel task per row, everything of a row computed in it.

Per row: the row input (smoothed when asked) is formed once into a one-row buffer, the minimum and the maximum
are vectorised reductions over it (rfactored into ``lanes`` partial results, then a
short horizontal step, as the LayerNorm template's statistics), the scale and zero point are scalars, and ``q``
is written with vector stores (division, round, clip and the narrowing cast on a vector). The row (K floats)
stays in L1 between its three passes, so the activation is read from memory once and ``q`` written once. Rows
whose length is not a multiple of the vector width keep scalar reductions and loops.

Knobs: ``unroll``: index into :data:`.rowwise.UNROLL_STEPS`. The vector width comes from the target.
"""

from __future__ import annotations

from typing import Optional

import tvm
from tvm import s_tir

from ...targets import TargetInfo
from ..rule import root_blocks
from .rowwise import RowwiseCPU, annotate_unroll, rfactor_lanes, vectorise_row_loops


def quantize_rows_cpu(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, target: tvm.target.Target,
                      knobs: Optional[dict] = None) -> None:
    knobs = knobs or {}
    lanes = TargetInfo.of(target).lanes()
    named = {sch.get(b).name_hint: b for b in root_blocks(sch)}
    stats = [named["qr_min"], named["qr_max"]]
    scale, zero, q = (named[n] for n in ("qr_scale", "qr_zero", "qr_q"))

    rfs = [rfactor_lanes(sch, stat, lanes) for stat in stats]
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

    vectorise_row_loops(sch, (block, q), rfs, lanes)

    annotate_unroll(sch, row, knobs)


class QuantizeRowsCPU(RowwiseCPU):
    """``fused_quantize_rows`` on CPU: one parallel task per row, vectorised range and quantisation."""

    block_rule = "tfx.quantize_rows"

    def schedule(self, sch, block, target, knobs=None):
        quantize_rows_cpu(sch, block, target, knobs)
