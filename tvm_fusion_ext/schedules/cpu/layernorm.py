"""CPU template for ``fused_layernorm``: one parallel loop over rows, everything else computed per row.

Per row: ``h = x (+ residual) (+ bias)`` is formed once into a row buffer (it stays in L1), the sum and the
squared deviations are vectorised reductions over that buffer (rfactor into ``lanes`` partial sums, then a
short horizontal add), and the normalised output is written with vector stores. Rows whose length is not a
multiple of the vector width keep scalar reductions and loops (still one parallel task per row).

Knobs: ``unroll``: index into :data:`.rowwise.UNROLL_STEPS` (``sample_categorical``). The vector width comes from
the target, not from the search.
"""

from __future__ import annotations

from typing import Optional

import tvm
from tvm import s_tir

from ...targets import TargetInfo
from ..common import row_loop
from ..rule import root_blocks
from .rowwise import RowwiseCPU, annotate_unroll, rfactor_lanes, split_vector, vectorise_row_loops

def layernorm_cpu(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, target: tvm.target.Target,
                  knobs: Optional[dict] = None) -> None:
    knobs = knobs or {}
    lanes = TargetInfo.of(target).lanes()
    blocks = root_blocks(sch)
    row_input, stats, out = block, [b for b in blocks[1:-1]], blocks[-1]

    rfs = [rfactor_lanes(sch, stat, lanes) for stat in stats]
    row, n = row_loop(sch, out)
    sch.parallel(row)
    vec = split_vector(sch, n, lanes)
    if vec is not None:
        sch.vectorize(vec[1])

    # Consumers first, so every producer lands under the row loop ahead of its consumers.
    producers = [row_input]
    for stat, rf in zip(stats, rfs):
        producers += [rf, stat] if rf is not None else [stat]
    for producer in reversed(producers):
        sch.compute_at(producer, row, preserve_unit_loops=True)

    vectorise_row_loops(sch, (row_input,), rfs, lanes)

    annotate_unroll(sch, row, knobs)


class LayerNormCPU(RowwiseCPU):
    """``fused_layernorm`` on CPU: one parallel task per row, vectorised statistics."""

    block_rule = "tfx.layernorm"

    def schedule(self, sch, block, target, knobs=None):
        layernorm_cpu(sch, block, target, knobs)
