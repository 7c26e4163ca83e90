"""CUDA (SIMT, fp32 accumulation) template for the decode form of ``fused_attention`` (``ops/decode_attention.py``).

Shape of the schedule (``G`` = query heads per K/V head on threadIdx.y, ``lanes`` = a warp on threadIdx.x)::

    kernel 1: blockIdx.x = (b, kv head, split)                  # B × Hkv × splits blocks: a long cache fills
                                                                #   the GPU at batch 1
        q_group[g, d]   shared      the group's query rows in fp32 (rotated once, for rotary Q)
        split state (max, sum, out)[g, d]   registers: thread (g, d mod lanes) owns its columns
        for key block of the split:
            kt[d, key]  shared      the K tile, all threads loading it once for the whole group (rotated once)
            v_tile[key, d] shared   the V tile, likewise
            qk[g, key]  shared      thread (g, key mod lanes), dot over d
            bmax        registers   warp all-reduce per query head
            p[g, key]   shared
            bsum        shared      warp all-reduce per query head
            bo[g, d]    registers   thread (g, d mod lanes), sum over the block's keys
            fold into the split state
        the split's partial (max, sum, out) to global memory
    kernel 2: blockIdx.x = (b, row, head), threadIdx.x = d      # the combine
        merge the splits (online softmax) in registers, out = merged out / merged sum

The splits' count follows the key count (the operator's ``split_blocks`` key blocks per split), so a symbolic P
needs no re-build. The tiles are ``key_block`` keys: :data:`CUDA_DECODE_KEY_BLOCK` (one key per lane; fp32 K and
V tiles of head dim 128 take 16 KiB each, and share one buffer) unless the caller set one. A group wider than a
block holds (more than 32 query heads per K/V head) is declined: :func:`group_fits`. Knobs: ``unroll`` (index into
UNROLL).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tvm import s_tir

from ...ops.decode_attention import decode_key_block, decode_params
from ..attention_blocks import kernel_stages
from ..common import categorical
from ..rule import Knobs, TemplateRule
from .tensorcore import WARP

STAGES = ("dec_merge", "dec_split", "dec_bo", "dec_bsum", "dec_p", "dec_bmax", "dec_s", "dec_qk", "dec_kt",
          "dec_vt", "dec_q")
UNROLL = (0, 16, 64)
#: keys per tile on CUDA: a key per lane of a warp
CUDA_DECODE_KEY_BLOCK = WARP
#: key blocks per split on CUDA: 128 keys per thread block (LLaMA-7B's 8 K/V heads at batch 1: 32 blocks at
#: P = 512, 512 at P = 8192)
CUDA_DECODE_SPLIT_BLOCKS = 4


def cuda_decode_params(params: dict, keys) -> dict:
    """``fused_attention``'s parameters for the decode form this template is written for: tiles of at most a
    warp's keys (a short static cache takes a shorter power of two), :data:`CUDA_DECODE_SPLIT_BLOCKS` per split."""
    return decode_params(params, keys, key_block=min(decode_key_block(keys), CUDA_DECODE_KEY_BLOCK),
                         split_blocks=CUDA_DECODE_SPLIT_BLOCKS)


def decode_stages(sch: s_tir.Schedule, out) -> dict:
    return kernel_stages(sch, out, STAGES, "tfx.decode_attention: not a decode attention kernel")


def group_fits(group: int, key_block: int, target) -> bool:
    """Whether a K/V head's ``group`` query heads, a row of ``min(warp, key_block)`` lanes each, fit one thread
    block: the template puts the whole group on threadIdx.y (up to 32 query heads per K/V head at 1024 threads).
    A wider group would loop over its heads around the warp all-reduces, which TVM's reduction lowering refuses."""
    max_threads = int(target.attrs.get("max_num_threads", 1024) or 1024)
    return group * min(WARP, key_block) <= max_threads


def _heads_lanes(sch, g_loop, lane_loop, lanes):
    """g → threadIdx.y; the lane loop split so that its inner ``lanes``-sized part is threadIdx.x. Returns
    (lane outer, lane)."""
    sch.bind(g_loop, "threadIdx.y")
    outer, inner = sch.split(lane_loop, [None, lanes])
    sch.bind(inner, "threadIdx.x")
    return outer, inner


def _cooperative(sch, loops, heads, lanes):
    """``loops`` (innermost contiguous in global memory) fused and spread over all threads of the block, in the
    block's own shape (``heads`` × ``lanes``: every stage of a kernel must bind the same thread extents)."""
    fused = sch.fuse(*loops)
    _, ty, tx = sch.split(fused, [None, heads, lanes])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")


def decode_attention_cuda(sch: s_tir.Schedule, block, target, knobs: Optional[dict] = None) -> None:
    st = decode_stages(sch, block)
    # each lane computes its key's score where the row max and the exps read it
    for name in ("dec_s", "dec_bias") if "dec_bias" in st else ("dec_s",):
        sch.compute_inline(st.pop(name))
    max_threads = int(target.attrs.get("max_num_threads", 1024) or 1024)
    split = st["dec_split"]
    sb_, sh, ss, sg, sd, rb = sch.get_loops(split)
    group = int(sch.get(sg).extent)
    key_block = int(sch.get(sch.get_loops(st["dec_qk"])[-2]).extent)
    lanes = min(WARP, key_block)  # key blocks are powers of two ≥ 8: the key loops split evenly
    heads = group  # on threadIdx.y (the template declines groups that do not fit: group_fits)

    # kernel 2: the combine, one thread per output element, the merge of its splits in registers
    *outer, d = sch.get_loops(block)
    task_out = sch.fuse(*outer)
    sch.bind(task_out, "blockIdx.x")
    _, d_lane = sch.split(d, [None, min(int(sch.get(d).extent), max_threads)])
    sch.bind(d_lane, "threadIdx.x")
    merge = st["dec_merge"]
    sch.compute_at(merge, d_lane, preserve_unit_loops=True)
    for i in range(3):
        sch.set_scope(merge, i, "local")

    # kernel 1: one thread block per (batch, kv head, split), its key blocks the flash loop
    task = sch.fuse(sb_, sh, ss)
    sch.bind(task, "blockIdx.x")
    sch.reorder(rb, sg, sd)
    _heads_lanes(sch, sg, sd, lanes)
    # the split state in registers, written to the partials once the split's blocks are folded: each thread
    # stores the (head, column) elements it owns
    stores = [sch.cache_write(split, i, "local") for i in range(3)]
    for store in stores:
        if len(sch.get_loops(store)) == 5:  # still at the root: (b, hk, sp, g, d)
            sch.reverse_compute_at(store, task, preserve_unit_loops=True)
        *_, wg, wd = sch.get_loops(store)
        _heads_lanes(sch, wg, wd, lanes)
    sch.decompose_reduction(split, rb)

    for name in ("dec_bo", "dec_bsum", "dec_p", "dec_bmax", "dec_qk", "dec_kt"):  # consumers first
        sch.compute_at(st[name], rb, preserve_unit_loops=True)

    qg = st["dec_q"]  # the group's rows once per block, in shared memory
    sch.compute_at(qg, task, preserve_unit_loops=True)
    sch.set_scope(qg, 0, "shared")
    _cooperative(sch, sch.get_loops(qg)[-2:], heads, lanes)

    # the K tile: loaded once for the group, each K row's head dims by consecutive threads (coalesced)
    kt = st["dec_kt"]
    sch.set_scope(kt, 0, "shared")
    *_, kd, kj = sch.get_loops(kt)
    sch.reorder(kj, kd)
    _cooperative(sch, [kj, kd], heads, lanes)

    qk = st["dec_qk"]
    *_, qg_loop, qj, _ = sch.get_loops(qk)
    _, q_lane = _heads_lanes(sch, qg_loop, qj, lanes)
    # each score accumulated in a register, stored to shared once (ThreadSync would put barriers in every step
    # of the dot product otherwise)
    sch.set_scope(qk, 0, "shared")
    qk_store = sch.cache_write(qk, 0, "local")
    sch.reverse_compute_at(qk_store, q_lane, preserve_unit_loops=True)

    for red, scope in ((st["dec_bmax"], "local"), (st["dec_bsum"], "shared")):  # warp all-reduces per head
        *_, rg, rj = sch.get_loops(red)
        _heads_lanes(sch, rg, rj, lanes)
        sch.set_scope(red, 0, scope)

    p = st["dec_p"]
    *_, pg, pj = sch.get_loops(p)
    _heads_lanes(sch, pg, pj, lanes)
    sch.set_scope(p, 0, "shared")

    bo = st["dec_bo"]
    *_, vg, vd, vj = sch.get_loops(bo)
    _heads_lanes(sch, vg, vd, lanes)
    sch.set_scope(bo, 0, "local")
    # the V tile in shared memory, loaded once: every query head of the group reads each V row from there
    vt = st["dec_vt"]
    sch.compute_at(vt, rb, preserve_unit_loops=True)
    sch.set_scope(vt, 0, "shared")
    _cooperative(sch, sch.get_loops(vt)[-2:], heads, lanes)

    unroll = categorical(sch, UNROLL, "unroll", 64, knobs or {})
    sch.annotate(task, "pragma_auto_unroll_max_step", unroll)
    sch.annotate(task, "pragma_unroll_explicit", 1)


@dataclass(frozen=True)
class DecodeAttentionCudaKnobs(Knobs):
    unroll: Optional[int] = None  # index into UNROLL


class DecodeAttentionCUDA(TemplateRule):
    """The decode form of ``fused_attention`` on CUDA: a thread block per (batch, K/V head, key split), then a
    combine kernel."""

    block_rule = "tfx.decode_attention"
    family = "cuda"
    Knobs = DecodeAttentionCudaKnobs

    def transferable_knobs(self, static):
        return dict(static)

    def decline(self, sch, block, target):
        st = decode_stages(sch, block)
        group = int(sch.get(sch.get_loops(st["dec_split"])[3]).extent)
        key_block = int(sch.get(sch.get_loops(st["dec_qk"])[-2]).extent)
        if not group_fits(group, key_block, target):
            return f"{group} query heads per K/V head do not fit one thread block"
        return None

    def schedule(self, sch, block, target, knobs=None):
        decode_attention_cuda(sch, block, target, knobs)
