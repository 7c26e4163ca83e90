"""CUDA (SIMT, fp32 accumulation) template for ``fused_attention``: one thread block per query tile.

16-bit inputs whose shapes fit 16×16 tiles go to the tensor-core template of :mod:`.attention_mma` when it is
asked for (``TFX_CUDA_MMA_ATTENTION=1``; see there why it is opt-in).

Shape of the schedule (``rows`` = query rows per block on threadIdx.y, a warp on threadIdx.x)::

    kernel 1: kt = K transposed per key block, per K/V head        (global, coalesced writes; rotated for rotary K)
    kernel 2: blockIdx.x = (b, h, query tile)
        [qr[row, d]  shared                rotary Q only: the tile rotated once]
        running (max, sum, out)[row, d]   in registers: thread (row, d mod 32) owns its columns
        for key block:                                             # the flash loop
            qk[row, key]  shared   thread (row, key mod 32), dot over d
            bmax          local    warp all-reduce per row, the result in every lane of the row
            bsum          shared   warp all-reduce per row
            p[row, key]   shared
            bo[row, d]    local    thread (row, d mod 32), sum over the block's keys
            fold (bmax, bsum, bo) into the running state
        out[row, d] = running out / running sum

The score tile is ``rows × key_block`` in shared memory; nothing of size S×T exists. Knobs (MetaSchedule
decisions): ``rows`` (perfect tile ``[tiles, rows]`` of the query axis), ``unroll`` (index into UNROLL).

Batch, queries and keys known only at run time: :meth:`AttentionCUDA.prepare_operator` pads the query rows to
:data:`SYMBOLIC_QUERY_ROWS` (``query_block``; the operator pads keys to its key block itself), so the query
tiles split exactly, ``blockIdx.x`` takes the symbolic tile count, the flash loop runs a symbolic number of key
blocks, and only the copy of each tile's real rows to the output (``attn_out``) is predicated. That path is
SIMT for every dtype (the tensor-core template needs static 16-multiples).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import tvm
from tvm import s_tir

from ..attention_blocks import (
    STAGES,
    inline_low_precision_stages,
    kernel_stages,
    output_loops_bhsd,
    pad_symbolic_queries,
    separate_head_ranges,
    symbolic_rows_reason,
)
from ...ops.attention import LOW_PRECISION, call_keys
from ..common import categorical, op_params
from ..rule import Knobs, TemplateRule
from .attention_mma import KEY_BLOCK, attention_mma, opted_in, tensor_cores_fit
from .decode_attention import cuda_decode_params, group_fits
from .tensorcore import WARP

UNROLL = (0, 16, 64)
#: query rows per thread block when the query count is symbolic: the SIMT template's widest row tile
SYMBOLIC_QUERY_ROWS = 8


def _bind_rows_lanes(sch, row_loop, lane_loop, lanes):
    """row → threadIdx.y; the lane loop split so that its inner ``lanes``-sized part is threadIdx.x."""
    sch.bind(row_loop, "threadIdx.y")
    outer, inner = sch.split(lane_loop, [None, lanes])
    sch.bind(inner, "threadIdx.x")
    return outer, inner


def attention_cuda(sch: s_tir.Schedule, block, target, knobs: Optional[dict] = None) -> None:
    st = kernel_stages(sch, block)
    if tensor_cores_fit(sch, block, st, target):
        attention_mma(sch, block, target, knobs)
        return
    inline_low_precision_stages(sch, st)
    online, bo, bsum, p, bmax, qk, kt = (st[n] for n in STAGES)
    knobs = knobs or {}
    max_threads = int(target.attrs.get("max_num_threads", 1024) or 1024)
    # one lane width for the whole kernel; key blocks are powers of two ≥ 8, so the key loops split evenly
    # (a partial lane group there would put the all-reduces under a lane predicate, cf. rows below)
    lanes = min(WARP, int(sch.get(sch.get_loops(qk)[-2]).extent))
    b, h, s, d = output_loops_bhsd(sch, block)
    # a perfect split: a partial last tile would put the warp all-reduces and their barriers under a
    # row predicate, which ThreadSync refuses ("Cannot insert syncs inside condition")
    padded_rows = sch.get(block).name_hint == "attn_rows"
    if padded_rows:  # symbolic rows, padded by the operator to whole query tiles
        tile = int(op_params(sch)["query_block"])
        rows = int(knobs.get("rows", [None, tile])[-1])
        if tile % rows:
            raise ValueError(f"{rows} query rows per block do not divide the query block {tile}")
        s0, s1 = sch.split(s, [None, rows])
    else:
        n_rows = int(sch.get(s).extent)
        rows = max(r for r in range(1, min(max_threads // lanes, 8) + 1) if n_rows % r == 0)
        decision = knobs.get("rows", [n_rows // rows, rows])
        s0, s1 = sch.split(s, sch.sample_perfect_tile(s, n=2, max_innermost_factor=max_threads // lanes,
                                                       decision=list(decision)))
    sch.reorder(b, h, s0, s1, d)
    task = sch.fuse(b, h, s0)
    sch.bind(task, "blockIdx.x")
    _bind_rows_lanes(sch, s1, d, lanes)

    sch.compute_at(online, task, preserve_unit_loops=True)
    *_, ob, oh, oi, od, rb = sch.get_loops(online)
    sch.reorder(rb, ob, oh, oi, od)
    _bind_rows_lanes(sch, oi, od, lanes)
    sch.decompose_reduction(online, rb)
    for i in range(3):  # running max, sum, numerator: per-thread registers
        sch.set_scope(online, i, "local")

    for blk in (bo, bsum, p, bmax, qk):  # consumers first
        sch.compute_at(blk, rb, preserve_unit_loops=True)
    if "attn_qr" in st:  # rotary Q: the tile rotated once per block, into shared memory
        qr = st["attn_qr"]
        sch.compute_at(qr, task, preserve_unit_loops=True)
        sch.set_scope(qr, 0, "shared")
        *_, ri, rd = sch.get_loops(qr)
        _bind_rows_lanes(sch, ri, rd, lanes)

    *_, qi, _, qj, _ = sch.get_loops(qk)
    _, q_lane = _bind_rows_lanes(sch, qi, qj, lanes)
    # accumulate each score in a register, store it to shared once: accumulating in shared memory makes
    # ThreadSync put two barriers in every step of the dot product
    sch.set_scope(qk, 0, "shared")
    qk_store = sch.cache_write(qk, 0, "local")
    sch.reverse_compute_at(qk_store, q_lane, preserve_unit_loops=True)

    for red, scope in ((bmax, "local"), (bsum, "shared")):  # row reductions as warp all-reduces
        *_, ri, _, rj = sch.get_loops(red)
        _bind_rows_lanes(sch, ri, rj, lanes)
        # the row max in a register of every lane of the row: the all-reduce hands each lane the result, and the
        # score stage reads it right after. In shared memory only lane 0 stored it, and ThreadSync put no
        # barrier before the other lanes' reads when the index depends on the row alone (packed attention):
        # right only in a warp's lockstep
        sch.set_scope(red, 0, scope)

    *_, pi, _, pj = sch.get_loops(p)
    _bind_rows_lanes(sch, pi, pj, lanes)
    sch.set_scope(p, 0, "shared")

    *_, vi, _, vd, _ = sch.get_loops(bo)
    _bind_rows_lanes(sch, vi, vd, lanes)
    sch.set_scope(bo, 0, "local")

    kt_loop = sch.fuse(*sch.get_loops(kt))
    kt_blocks, kt_threads = sch.split(kt_loop, [None, 256])
    sch.bind(kt_blocks, "blockIdx.x")
    sch.bind(kt_threads, "threadIdx.x")

    if padded_rows:
        _write_back_real_rows(sch, block, task, lanes)

    unroll = categorical(sch, UNROLL, "unroll", 64, knobs)
    sch.annotate(task, "pragma_auto_unroll_max_step", unroll)
    sch.annotate(task, "pragma_unroll_explicit", 1)


def _write_back_real_rows(sch, rows_block, task, lanes) -> None:
    """Symbolic rows: ``attn_out`` copies the tile's real rows to the output from the running state in
    registers, the finish inlined into it, each thread writing the (row, column) it owns."""
    out = sch.get_consumers(rows_block)[0]
    sch.reverse_compute_at(out, task, preserve_unit_loops=True)
    sch.compute_inline(rows_block)
    loops = sch.get_loops(out)
    row, col = (loops[-2], loops[-1]) if _is_bhsd(sch, out) else (loops[-3], loops[-1])
    _bind_rows_lanes(sch, row, col, lanes)


def _is_bhsd(sch, out) -> bool:
    """Whether the output block iterates (b, h, s, d), else (b, s, h, d)."""
    return op_params(sch).get("out_layout", "BSHD") == "BHSD"


def _decode_form(call, target):
    """One static query row (a decode step built for static rows): the call as the split-K decode form
    (:mod:`.decode_attention`, its own template), else None (also for a GQA group wider than its thread block)."""
    params = call.params
    if params.get("query_block") is not None or params.get("split_blocks") is not None or "cu_seqlens" in call.inputs:
        return None
    rows = call.inputs["q"].ty.shape[2 if params.get("q_layout", "BSHD") == "BHSD" else 1]
    if not isinstance(rows, tvm.tirx.IntImm) or int(rows) != 1:
        return None
    keys = call.inputs["k"].ty.shape[2 if params.get("k_layout", "BSHD") == "BHSD" else 1]
    keys = int(keys) if isinstance(keys, tvm.tirx.IntImm) else keys
    decode = cuda_decode_params(params, keys)
    group = int(params.get("heads") or _heads(call, "q")) // int(params.get("kv_heads") or _heads(call, "k"))
    return call.replace(params=decode) if group_fits(group, decode["key_block"], target) else None


def _heads(call, name):
    return call.inputs[name].ty.shape[1 if call.params.get(f"{name}_layout", "BSHD") == "BHSD" else 2]


@dataclass(frozen=True)
class AttentionCudaKnobs(Knobs):
    rows: Optional[Sequence[int]] = None    # SIMT: [query tiles, rows per block]
    warps: Optional[Sequence[int]] = None   # tensor cores: [16-row tiles per block..., warps]
    unroll: Optional[int] = None            # index into the template's unroll steps


class AttentionCUDA(TemplateRule):
    """``fused_attention`` on CUDA: both flash-loop matmuls on tensor cores for 16-bit inputs that tile by 16,
    the SIMT flash loop otherwise."""

    block_rule = "tfx.attention"
    family = "cuda"
    Knobs = AttentionCudaKnobs

    def decline(self, sch, block, target):
        return symbolic_rows_reason(sch, block)

    def schedule(self, sch, block, target, knobs=None):
        attention_cuda(sch, block, target, knobs)

    def prepare_operator(self, call, target):
        """Symbolic query rows padded to whole row tiles (``query_block``); 16-bit attention with the key
        block the tensor-core template is sized for: the key block sets the score and operand tiles in shared
        memory, and the CPU default (up to 128 keys) would leave room for a single warp per block in 48 KiB.
        With the tensor-core template asked for, 16-bit head ranges of one tensor are sliced out to operands of
        their own (:func:`..attention_blocks.separate_head_ranges`)."""
        if call.op != "fused_attention":
            return None
        decode = _decode_form(call, target)
        if decode is not None:
            return decode
        wanted = pad_symbolic_queries(call, SYMBOLIC_QUERY_ROWS) or call
        keys = call_keys(call.inputs, call.params)
        if not isinstance(keys, tvm.tirx.IntImm) and call.params.get("key_block") is None:
            # a key per lane: wider blocks give each thread several scores, kept in a stack array
            wanted = wanted.replace(params=dict(wanted.params, key_block=WARP))
        if (str(call.inputs["q"].ty.dtype) in LOW_PRECISION and isinstance(keys, tvm.tirx.IntImm)
                and int(keys) >= KEY_BLOCK and call.params.get("key_block") != KEY_BLOCK):
            wanted = wanted.replace(params=dict(wanted.params, key_block=KEY_BLOCK))
        rows = call.inputs["q"].ty.shape[2 if call.params.get("q_layout", "BSHD") == "BHSD" else 1]
        if str(call.inputs["q"].ty.dtype) in LOW_PRECISION and opted_in() and isinstance(rows, tvm.tirx.IntImm):
            # the tensor-core template stages each operand as a whole [B, S, H, D] tile source: head ranges of a
            # QKV projection are copied out for it (what the split did before they were read in place)
            wanted = separate_head_ranges(wanted) or wanted
        return None if wanted is call else wanted
