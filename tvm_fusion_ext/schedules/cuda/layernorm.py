"""CUDA template for ``fused_layernorm``: one thread block per row.

Per row (``blockIdx.x``)::

    h = x (+ residual) (+ bias)       all threads, vector loads of ``vec`` elements, row kept in shared memory
    sum(h), sum((h - mean)²)          cross-thread reductions: each thread folds a strided slice, then TVM's
                                      allreduce lowering combines them with warp shuffles (and shared memory
                                      across warps); the two statistics live in shared memory
    y = (h - mean) · rstd · γ + β      all threads, vector stores

The row is read from global memory once; the two-pass statistics re-read it from shared memory (a 768-wide
fp32 row is 3 KiB), which keeps the numerically safer two-pass variance of the operator at no extra DRAM cost.
Rows too long for the target's shared memory re-form ``h`` from global memory in each pass instead.

Knobs: ``threads``: index into the candidate block sizes (:func:`thread_candidates`, multiples of the warp
size that divide the row in vectors, up to the target's limit); ``unroll``: index into :data:`UNROLL_STEPS`.
The vector width follows from the row length (static), not from the search.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import tvm
from tvm import s_tir

from ..common import inline_consumers, row_loop
from ..rule import Knobs, TemplateRule, root_blocks
from ...targets import TargetInfo

UNROLL_STEPS = (0, 16, 64)
#: lanes per vector access: the statistics and the normalisation run in fp32, and TVM's CUDA codegen has
#: no fp32 vector type wider than float4 (8 lanes become ulonglong4 hacks that nvcc rejects)
VECTOR_LANES = 4
#: shared memory left for the reductions' scratch when the fp32 row is staged
SMEM_RESERVE = 1024
#: threads aimed at per row: enough warps to hide latency, rows of BERT width still give each thread work
TARGET_THREADS = 128


def vector_width(n: int) -> int:
    w = VECTOR_LANES
    while w > 1 and n % w:
        w //= 2
    return w


def thread_candidates(n_vectors: int, lim: dict) -> List[int]:
    """Block sizes that split the row's vectors evenly: multiples of the warp size, within the limit."""
    cands = [t for t in range(lim["warp"], lim["threads"] + 1, lim["warp"]) if n_vectors % t == 0]
    return cands or [lim["warp"]]


def _default_threads(cands: List[int]) -> int:
    below = [t for t in cands if t <= TARGET_THREADS]
    return cands.index(max(below) if below else min(cands))


def layernorm_cuda(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, target: tvm.target.Target,
                   knobs: Optional[dict] = None) -> None:
    knobs = knobs or {}
    lim = TargetInfo.of(target).limits()
    blocks = root_blocks(sch)
    row_input, stats, out = block, list(blocks[1:-1]), blocks[-1]
    inline_consumers(sch, out)

    n = int(sch.get(out).iter_vars[-1].dom.extent)
    vec = vector_width(n)
    cands = thread_candidates(n // vec, lim)
    threads = sch.sample_categorical(cands, [1.0 / len(cands)] * len(cands),
                                     decision=knobs.get("threads", _default_threads(cands)))

    row, col = row_loop(sch, out)
    sch.bind(row, "blockIdx.x")
    _, tx, v = sch.split(col, [None, threads, vec])
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(v)

    # consumers first, so each producer lands under the row loop ahead of its consumer
    for stat in reversed(stats):
        sch.compute_at(stat, row, preserve_unit_loops=True)
        sch.set_scope(stat, 0, "shared")
        _, rt = sch.split(sch.get_loops(stat)[-1], [None, threads])
        sch.bind(rt, "threadIdx.x")
    if n * 4 + SMEM_RESERVE <= lim["smem"]:
        sch.compute_at(row_input, row, preserve_unit_loops=True)
        sch.set_scope(row_input, 0, "shared")
        _, tx, v = sch.split(sch.get_loops(row_input)[-1], [None, threads, vec])
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(v)
    else:
        # a row longer than shared memory: every pass re-forms h from global memory (through L2)
        sch.compute_inline(row_input)

    u = sch.sample_categorical(list(UNROLL_STEPS), [1.0 / len(UNROLL_STEPS)] * len(UNROLL_STEPS),
                               decision=knobs.get("unroll", 1))
    sch.annotate(row, "pragma_auto_unroll_max_step", u)
    sch.annotate(row, "pragma_unroll_explicit", 1)


@dataclass(frozen=True)
class LayerNormCudaKnobs(Knobs):
    threads: Optional[int] = None           # index into thread_candidates(...)
    unroll: Optional[int] = None            # index into UNROLL_STEPS


class LayerNormCUDA(TemplateRule):
    """``fused_layernorm`` on CUDA: one thread block per row, the row staged in shared memory."""

    block_rule = "tfx.layernorm"
    family = "cuda"
    Knobs = LayerNormCudaKnobs

    def decline(self, sch, block, target):
        # rows (batch × sequence) may be symbolic: they are blockIdx.x; the row width sets the vector width
        # and the thread split, so it may not
        width = sch.get(sch.get_loops(block)[-1]).extent
        return None if isinstance(width, tvm.tirx.IntImm) else f"row width {width} is symbolic"

    def transferable_knobs(self, static):
        """``threads`` and ``unroll``: the thread candidates follow the row width, one block runs one row
        whatever the row count."""
        return {k: v for k, v in static.items() if k in ("threads", "unroll")}

    def schedule(self, sch, block, target, knobs=None):
        layernorm_cuda(sch, block, target, knobs)
