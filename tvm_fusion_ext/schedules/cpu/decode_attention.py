"""CPU template for the decode form of ``fused_attention`` (blocks of ``ops/decode_attention.py``).

Shape of the schedule::

    parallel for (split, b, kv head):                # splits × B × Hkv tasks: a long cache feeds every core
        q_group = the group's query rows              # fp32, rotated once for rotary Q
        init the split's (max, sum, out) for the group's query heads
        for key block of the split:
            bias = mask or 0, -inf past the keys     # once per key for the whole group (a shared mask)
            for key:                                  # K rows read where they lie, once for the whole group
                prefetch K row key + 16, V row key   # software prefetch (compile/codegen/row_prefetch.py)
                qk_lanes = q_group · k_row           # per group row, head dim vectorised: partial dot products
            qk   = sum of qk_lanes                    # one short sum per (group row, key)
            s = scale · qk + bias                    # keys vectorised, once for the max and the exps
            bmax = row max                           # vector partials over the keys, then a short tail
            p = exp(s - bmax)                        # keys vectorised
            bsum = row sum                           # vector partials, as the max
            bo = p · v_block                         # head dim vectorised, V rows streamed once
            fold (bmax, bsum, bo) into the split's state    # taken as they are when the split is one block
    parallel for (b, row, head):
        merge the head's splits (online softmax)      # head dim vectorised
        out = merged out / merged sum

q·kᵀ takes dot products along the head dim (``rfactor`` over its vector lanes) because K rows are contiguous in the
head dim: copying each block key-contiguous first, for a micro-kernel vectorised over keys, cost one scalar store
per element, and the store queue then held each core to about one K row ahead of its loads (measured on the 2-core
Zen 3 VM, the kernel alone, 16 heads on 4 K/V heads, head dim 64: 1.2-1.4x faster at batch 1 and 4, past 511
and 2047). A head dim the vector does not divide keeps that copy (``qk_rows`` / ``qk_vec`` then apply).

Knobs: ``qk_rows`` / ``pv_rows`` (categorical, ROW_STEPS: query heads of the group per register block),
``qk_vec`` / ``pv_vec`` / ``s_vec`` / ``p_vec`` / ``state_vec`` / ``merge_vec`` / ``out_vec`` (perfect tiles
``[outer, lanes]``), ``unroll`` (UNROLL). The number of splits is the operator's (``split_blocks``: key blocks
per split), like its key block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from tvm import s_tir

from ...targets import TargetInfo
from ..attention_blocks import kernel_stages
from ..common import ROW_PREFETCH_KEY, categorical, row_prefetch_annotation
from ..rule import Knobs, TemplateRule
from .attention import ROW_STEPS, UNROLL, _rfactor_row_reduce, _vector_split

#: K rows prefetched this many keys ahead of q·kᵀ, V rows at their key (p·v reads them a little later): see
#: compile/codegen/row_prefetch.py. The kernel alone (LLaMA-1024's 16 heads on 4 K/V heads, symbolic past, 2-core
#: Zen 3 VM, calls interleaved) ran 10-20 % faster at batch 1 and 4, past 511 and 2047, with 4, 8, 16 or 32 keys
#: ahead alike; outputs bitwise unchanged
PREFETCH_KEYS_AHEAD = 16

STAGES = ("dec_merge", "dec_split", "dec_bo", "dec_bsum", "dec_p", "dec_bmax", "dec_s", "dec_qk", "dec_kt",
          "dec_q")


def decode_stages(sch: s_tir.Schedule, out) -> dict:
    """The decode kernel's blocks by name, found through the producer graph."""
    return kernel_stages(sch, out, STAGES, "tfx.decode_attention: not a decode attention kernel")


def _group_kernel(sch, block, rows_knob, vec_knob, lanes, knobs):
    """(group rows × vector lanes) accumulators in registers, the reduction loop outside them."""
    *_, g, j, r = sch.get_loops(block)
    rows = int(sch.get(g).extent)
    step = categorical(sch, ROW_STEPS, rows_knob, max(s for s in ROW_STEPS if rows % s == 0), knobs)
    g0, g1 = sch.split(g, [None, step])
    j0, j1 = _vector_split(sch, j, vec_knob, 2 * lanes, knobs, 64)
    sch.reorder(g0, j0, r, g1, j1)
    sch.unroll(g1)
    sch.vectorize(j1)
    sch.decompose_reduction(block, r)


def _vectorize_row_partials(sch, partials):
    # under the key block, the partials' loops come in block-var order: (lane, b, kv head, split, block, group row,
    # key); each group row's keys then run over whole vectors of lanes
    lane, *_, rows, keys = sch.get_loops(partials)[-7:]
    sch.reorder(rows, keys, lane)
    sch.vectorize(lane)
    sch.decompose_reduction(partials, keys)


def _dot_product_kernel(sch, partial, qk):
    """Per key: its K row's vectors times the group's query rows, one accumulator vector per row (the K row read
    once for the group); then each (row, key) sums its lanes in order."""
    lane, *_, rows, keys, steps = sch.get_loops(partial)[-8:]
    # a few rows per pass over the K row: their accumulators stay in registers (MQA groups reach 32 rows)
    step = max(d for d in ROW_STEPS if int(sch.get(rows).extent) % d == 0)
    row_passes, rows = sch.split(rows, [None, step])
    sch.reorder(keys, row_passes, steps, rows, lane)
    if PREFETCH_KEYS_AHEAD:
        sch.annotate(keys, ROW_PREFETCH_KEY, row_prefetch_annotation([("k", PREFETCH_KEYS_AHEAD), ("v", 0)]))
    sch.vectorize(lane)
    sch.unroll(rows)
    sch.decompose_reduction(partial, steps)
    lane_sum, *_, sum_rows, sum_keys = sch.get_loops(qk)[-7:]
    sch.reorder(sum_rows, sum_keys, lane_sum)
    sch.unroll(lane_sum)


def decode_attention_cpu(sch: s_tir.Schedule, block, target, knobs: Optional[dict] = None) -> None:
    st = decode_stages(sch, block)
    lanes = TargetInfo.of(target).lanes()
    if "dec_vt" in st:  # V rows streamed where they are used: the whole split's V is an L2 working set
        sch.compute_inline(st["dec_vt"])
    head_dim = int(sch.get(sch.get_loops(st["dec_qk"])[-1]).extent)
    dot_products = head_dim % lanes == 0
    if dot_products:  # q·kᵀ along the head dim: partial sums per vector lane, reduced after (see the module doc)
        sch.compute_inline(st.pop("dec_kt"))
        *_, r = sch.get_loops(st["dec_qk"])
        _, r_lanes = sch.split(r, [None, lanes])
        st["dec_qk_lanes"] = sch.rfactor(r_lanes, factor_axis=len(sch.get(st["dec_qk"]).writes[0].region))
    # the block's row max and row sum as vector partials over the keys, then a short scalar tail: a plain
    # reduction over the block's keys runs as a scalar chain with a select and a mask load per key (the kernel
    # alone, LLaMA-1024's heads, 2-core Zen 3 VM, calls interleaved: 7-10 % faster at batch 1 and 4, past 511
    # and 2047)
    for name in ("dec_bmax", "dec_bsum"):
        st[name + "_rf"] = _rfactor_row_reduce(sch, st[name], lanes)

    # the output: one row per (batch, head), head dim vectorised
    *outer, d = sch.get_loops(block)
    task_out = sch.fuse(*outer)
    sch.parallel(task_out)
    sch.vectorize(_vector_split(sch, d, "out_vec", lanes, knobs, 64)[1])

    # the merge of the splits: per output row (batch, head), under the output's parallel loop: one launch of the
    # thread pool for both, which a one-row call feels (the kernel alone, LLaMA-1024's heads, 2-core Zen 3 VM,
    # calls interleaved: 0.086 -> 0.079 ms at batch 1, past 511; batch 4 unchanged); the splits' loop outside the
    # vector of head dims
    merge = st["dec_merge"]
    sch.compute_at(merge, task_out, preserve_unit_loops=True)
    *_, md, ms = sch.get_loops(merge)
    sch.reorder(ms, md)
    sch.vectorize(_vector_split(sch, md, "merge_vec", lanes, knobs, 64)[1])
    sch.decompose_reduction(merge, ms)

    # one task per (batch, kv head, split); the split's key blocks are its flash loop
    split = st["dec_split"]
    sb_, sh, ss, sg, sd, rb = sch.get_loops(split)
    # the split outermost in the fused task: the task's batch and head then come from divisions by constants and
    # the batch size (a shape, known non-negative), its split from one by batch × heads. Split inside, batch and
    # head come from divisions by the split count, which a past passed as a scalar (keys = past + rows) leaves of
    # unknown sign: the per-task buffers' offsets then stay clamped (min(., 0) of those divisions) in every load
    # of the fold, which repeats each load hundreds of times through its inlined exp, and TVM's code generation
    # analysed each one: 30-45 s for this branch alone, 1 s with the split outermost
    sch.reorder(ss, sb_, sh)
    task = sch.fuse(ss, sb_, sh)
    sch.parallel(task)
    sch.reorder(rb, sg, sd)
    sch.vectorize(_vector_split(sch, sd, "state_vec", lanes, knobs, 64)[1])
    sch.decompose_reduction(split, rb)

    for name in ("dec_bo", "dec_bsum", "dec_bsum_rf", "dec_p", "dec_bmax", "dec_bmax_rf", "dec_s", "dec_bias",
                 "dec_qk", "dec_qk_lanes", "dec_kt"):  # consumers first
        if name in st:
            sch.compute_at(st[name], rb, preserve_unit_loops=True)
    for name in ("dec_bmax_rf", "dec_bsum_rf"):
        _vectorize_row_partials(sch, st[name])

    # the group's query rows (rotated once, for rotary Q) under the task, head dim vectorised
    qg = st["dec_q"]
    sch.compute_at(qg, task, preserve_unit_loops=True)
    sch.vectorize(sch.get_loops(qg)[-1])

    if dot_products:
        _dot_product_kernel(sch, st["dec_qk_lanes"], st["dec_qk"])
    else:
        # K's block copied key-contiguous: one K row at a time, its head dims read as one vector
        *_, kd, kjj = sch.get_loops(st["dec_kt"])
        sch.reorder(kjj, kd)
        sch.vectorize(kd)
        _group_kernel(sch, st["dec_qk"], "qk_rows", "qk_vec", lanes, knobs)
    # the scores, and the mask's reads past a clamp (a gather), once per block rather than in both the row max
    # and the exps, for every query head of the group (the kernel alone, LLaMA-1024's heads, 2-core Zen 3 VM, calls
    # interleaved: 8-20 % faster at batch 1 and 4, past 511 and 2047)
    for name in ("dec_s", "dec_bias") if "dec_bias" in st else ("dec_s",):
        sch.vectorize(_vector_split(sch, sch.get_loops(st[name])[-1], "s_vec", lanes, knobs, 64)[1])
    sch.vectorize(_vector_split(sch, sch.get_loops(st["dec_p"])[-1], "p_vec", 2 * lanes, knobs, 64)[1])
    _group_kernel(sch, st["dec_bo"], "pv_rows", "pv_vec", lanes, knobs)

    # no unrolling by default: LLVM's time on this kernel grows with it (a two-layer LLaMA's symbolic build:
    # 38 s at 0, 58 s at 8, 121 s at 16, against 7 s without the decode branch) while the step reads memory
    unroll = categorical(sch, UNROLL, "unroll", 0, knobs)
    sch.annotate(task, "pragma_auto_unroll_max_step", unroll)
    sch.annotate(task, "pragma_unroll_explicit", 1)


@dataclass(frozen=True)
class DecodeAttentionCpuKnobs(Knobs):
    qk_rows: Optional[int] = None            # index into ROW_STEPS
    pv_rows: Optional[int] = None            # index into ROW_STEPS
    unroll: Optional[int] = None             # index into UNROLL
    qk_vec: Optional[Sequence[int]] = None   # [outer, lanes] perfect tiles
    pv_vec: Optional[Sequence[int]] = None
    s_vec: Optional[Sequence[int]] = None
    p_vec: Optional[Sequence[int]] = None
    state_vec: Optional[Sequence[int]] = None
    merge_vec: Optional[Sequence[int]] = None
    out_vec: Optional[Sequence[int]] = None


class DecodeAttentionCPU(TemplateRule):
    """The decode form of ``fused_attention`` on CPU: parallel (batch, K/V head, key split) tasks, then a merge."""

    block_rule = "tfx.decode_attention"
    family = "cpu"
    Knobs = DecodeAttentionCpuKnobs

    def transferable_knobs(self, static):
        """Every knob: each tiles the group, the key block or the head dim, none the key count."""
        return dict(static)

    def schedule(self, sch, block, target, knobs=None):
        decode_attention_cpu(sch, block, target, knobs)
