"""CPU template for ``fused_attention`` (blocks of ``ops/attention.py``).

Shape of the schedule::

    parallel for (b, h, query tile):                 # one task per tile of ``query_tile`` rows
        [qr = rotary(q tile)]                        # rotary Q only: the tile, rotated once
        init running (max, sum, out) for the tile
        for key block:                               # the flash loop
            qk    = q_tile · kt_block                # rows × keys, keys vectorised, ``qk_rows`` rows per step
            bmax  = row max;  p = exp(qk - bmax)     # keys vectorised
            bsum  = row sum;  bo = p · v_block       # head dim vectorised, ``pv_rows`` rows per step
            fold (bmax, bsum, bo) into the running state
        out = running out / running sum
    parallel for (b, h_kv, key block): kt = K transposed per block   # keys contiguous for the qk micro-kernel
                                                                     # (rotated there for rotary K)

For causal attention the build bounds the key-block loop by the tile's last row
(:mod:`...compile.variants.causal_skip`); grouped-query attention reads K/V head ``h // group`` in place.

Everything under the key-block loop is sized (query tile × key block) or (query tile × head dim): no
buffer of S×T elements exists. Row max / row sum are rfactored into vector-lane partials.

Knobs (MetaSchedule decisions, as recorded in a trace):

* categorical (index into the candidates): ``query_tile`` (QUERY_TILES), ``qk_rows`` / ``pv_rows``
  (ROW_STEPS: rows per register block of q·kᵀ / p·v), ``unroll`` (UNROLL);
* perfect tiles ``[outer, lanes]``: ``qk_vec`` (keys per q·kᵀ step), ``pv_vec`` (head-dim lanes per p·v step),
  ``p_vec``, ``online_vec``, ``out_vec``.

Defaults (4 × 2 vectors of accumulators in both micro-kernels, 32-row tiles) were measured on a 2-core AVX2
EPYC (one thread, S = T = 1024, d 64: ~56 GFLOP/s, ~60 % of FMA peak). The target must name the CPU
(``"mcpu": "znver3"`` / ``"core-avx2"``): plain ``llvm`` means SSE2 x86-64 and runs this kernel 4.6× slower.
The key-block size is part of the operator (its ``key_block`` parameter), not of the schedule: the
online-softmax fold is defined per block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from tvm import s_tir, tirx

from ..attention_blocks import (STAGES, inline_low_precision_stages, kernel_stages, output_loops_bhsd,
                                pad_symbolic_queries, symbolic_rows_reason)
from ...ops.attention import call_keys
from ...ops.decode_attention import decode_params
from ...targets import TargetInfo
from ..common import categorical, op_params
from ..rule import Knobs, TemplateRule

QUERY_TILES = (1, 2, 4, 8, 16, 32, 64)
ROW_STEPS = (1, 2, 4)
#: query tile (and row padding) for symbolic query rows: short requests waste at most 15 padded rows; measured
#: with 32-key blocks on the 2-core AVX2 box (12 heads, d 32, noisy): within 0.9–1.3× of the static kernel at
#: S = 16…384, where 32-row tiles cost 1.5–1.9×
SYMBOLIC_QUERY_TILE = 16
UNROLL = (0, 8, 16)  # 64 unrolls the exp polynomials of whole key blocks: ~60 s to compile, no faster

def _vector_split(sch, loop, knob, default, knobs, max_lanes):
    """Split ``loop`` into (outer, lanes); the knob is the perfect-tile decision ``[outer, lanes]``."""
    extent = int(sch.get(loop).extent)
    decision = (knobs or {}).get(knob)
    if decision is None:
        lanes = max(f for f in range(1, min(default, extent) + 1) if extent % f == 0)
        decision = [extent // lanes, lanes]
    if len(decision) != 2 or decision[0] * decision[1] != extent:
        raise ValueError(f"tfx.attention: knob {knob}={list(decision)} does not tile a loop of {extent}")
    factors = sch.sample_perfect_tile(loop, n=2, max_innermost_factor=max_lanes, decision=list(decision))
    return sch.split(loop, factors)


def _micro_kernel(sch, block, rows_knob, vec_knob, lanes, knobs):
    """(rows × vector lanes) accumulators in registers, the reduction loop outside them."""
    *_, i, _, j, r = sch.get_loops(block)
    i0, i1 = sch.split(i, [None, categorical(sch, ROW_STEPS, rows_knob, 4, knobs)])
    j0, j1 = _vector_split(sch, j, vec_knob, 2 * lanes, knobs, 64)
    sch.reorder(i0, j0, r, i1, j1)
    sch.unroll(i1)
    sch.vectorize(j1)
    sch.decompose_reduction(block, r)


def _rfactor_row_reduce(sch, blk, lanes):
    """Split a key-block row max / row sum into ``lanes`` vector partials (rfactor) + a short scalar tail.

    A plain reduction loop cannot be vectorised and runs as a latency-bound scalar chain. rfactor needs the
    block alone under its loops, so this runs before anything is moved; returns the partials' block.
    """
    r = sch.get_loops(blk)[-1]
    _, r1 = sch.split(r, [None, min(lanes, int(sch.get(r).extent))])  # key blocks are powers of two ≥ 8
    # partials indexed [<the reduction's output index>, lane] (prefill: [b, h, i, key block, lane]): lanes contiguous
    return sch.rfactor(r1, len(sch.get(blk).writes[0].region))


def _vectorize_partials(sch, rf):
    # after compute_at the partials' loops come in block-var order: (lane, b, h, i, key block, key)
    lane, _, _, i, _, r = sch.get_loops(rf)[-6:]
    sch.reorder(i, r, lane)
    sch.vectorize(lane)
    sch.decompose_reduction(rf, r)


def default_query_tile(rows) -> int:
    """32-row tiles (16 KiB of scores per 128-key block: L1/L2 resident), fewer for short static sequences;
    symbolic rows are padded to the tile (``query_block``), so they take a shorter one."""
    n_rows = int(rows) if isinstance(rows, (int, tirx.IntImm)) else SYMBOLIC_QUERY_TILE
    return min(32, max(t for t in QUERY_TILES if t <= max(n_rows, 1)))


def _default_tile(sch, rows) -> int:
    """Symbolic rows are padded to the operator's ``query_block``: the tile is that block (a short-request
    variant pads to fewer rows than :data:`SYMBOLIC_QUERY_TILE`, see compile/variants/short_keys.py)."""
    block = op_params(sch).get("query_block")
    if not isinstance(rows, (int, tirx.IntImm)) and block in QUERY_TILES:
        return int(block)
    return default_query_tile(rows)


def _write_back_real_rows(sch, rows_block, task) -> None:
    """The kernel's rows are padded to whole tiles (``attn_rows``); ``attn_out`` copies each tile's real rows
    to the output under the tile's loop, the finish inlined into it (no padded output buffer)."""
    out = sch.get_consumers(rows_block)[0]
    sch.reverse_compute_at(out, task, preserve_unit_loops=True)
    sch.compute_inline(rows_block)
    sch.vectorize(sch.get_loops(out)[-1])


def _transpose_reading_rows(sch, kd, kjj) -> None:
    """K's copy into key-contiguous blocks: one key at a time, its head dims read as one vector.

    Vectorised over the keys instead, each vector gathers 16 keys a row apart through clamped 64-bit
    indices (the padding keys read the last one), which LLVM scalarises into extract/insert sequences:
    ~9 % of the kernel at (8, 128) in MiniLM's form. Reading whole rows and scattering the stores ran the
    kernel 0.92–0.97× at (1, 128), (1, 384), (8, 128), the same at 16 and 48 keys (docs/benchmarks.md,
    "2026-11-28: K's key-block copy reads rows")."""
    sch.reorder(kjj, kd)
    sch.vectorize(kd)


def attention_cpu(sch: s_tir.Schedule, block, target, knobs: Optional[dict] = None) -> None:
    st = kernel_stages(sch, block)
    inline_low_precision_stages(sch, st)
    online, bo, bsum, p, bmax, qk, kt = (st[n] for n in STAGES)
    lanes = TargetInfo.of(target).lanes()
    bmax_rf = _rfactor_row_reduce(sch, bmax, lanes)
    bsum_rf = _rfactor_row_reduce(sch, bsum, lanes)

    # parallel query tiles; the output epilogue runs per tile
    b, h, s, d = output_loops_bhsd(sch, block)
    tile = categorical(sch, QUERY_TILES, "query_tile", _default_tile(sch, sch.get(s).extent), knobs)
    s0, s1 = sch.split(s, [None, tile])
    sch.reorder(b, h, s0, s1, d)
    task = sch.fuse(b, h, s0)
    sch.parallel(task)
    sch.vectorize(_vector_split(sch, d, "out_vec", lanes, knobs, 64)[1])

    # the running state lives per tile; the key-block loop becomes the flash loop
    sch.compute_at(online, task, preserve_unit_loops=True)
    *_, ob, oh, oi, od, rb = sch.get_loops(online)
    sch.reorder(rb, ob, oh, oi, od)
    sch.vectorize(_vector_split(sch, od, "online_vec", lanes, knobs, 64)[1])
    sch.decompose_reduction(online, rb)

    for blk in (bo, bsum, bsum_rf, p, bmax, bmax_rf, qk):  # consumers first
        sch.compute_at(blk, rb, preserve_unit_loops=True)
    if "attn_qr" in st:  # rotary Q: rotated once per query tile, into a tile-sized buffer
        sch.compute_at(st["attn_qr"], task, preserve_unit_loops=True)

    # qk: register-blocked (rows × key lanes) micro-kernel over the head dim
    _micro_kernel(sch, qk, "qk_rows", "qk_vec", lanes, knobs)

    sch.vectorize(_vector_split(sch, sch.get_loops(p)[-1], "p_vec", 2 * lanes, knobs, 64)[1])
    for rf in (bmax_rf, bsum_rf):
        _vectorize_partials(sch, rf)

    # p·v: (rows × head-dim lanes) micro-kernel over the keys of the block
    _micro_kernel(sch, bo, "pv_rows", "pv_vec", lanes, knobs)

    # K transposed once per (b, h, key block), in parallel
    kb_, kh, kjb, kd, kjj = sch.get_loops(kt)
    kt_task = sch.fuse(kb_, kh, kjb)
    sch.parallel(kt_task)
    _transpose_reading_rows(sch, kd, kjj)

    if "attn_rows" == sch.get(block).name_hint:  # symbolic rows: write the real rows of each tile out
        _write_back_real_rows(sch, block, task)

    unroll = categorical(sch, UNROLL, "unroll", 16, knobs)
    for loop in (task, kt_task):
        sch.annotate(loop, "pragma_auto_unroll_max_step", unroll)
        sch.annotate(loop, "pragma_unroll_explicit", 1)


@dataclass(frozen=True)
class AttentionCpuKnobs(Knobs):
    query_tile: Optional[int] = None        # index into QUERY_TILES
    qk_rows: Optional[int] = None           # index into ROW_STEPS
    pv_rows: Optional[int] = None           # index into ROW_STEPS
    unroll: Optional[int] = None            # index into UNROLL
    qk_vec: Optional[Sequence[int]] = None  # [outer, lanes] perfect tiles
    pv_vec: Optional[Sequence[int]] = None
    p_vec: Optional[Sequence[int]] = None
    online_vec: Optional[Sequence[int]] = None
    out_vec: Optional[Sequence[int]] = None


class AttentionCPU(TemplateRule):
    """``fused_attention`` on CPU: parallel query tiles, the flash loop over key blocks inside each."""

    block_rule = "tfx.attention"
    family = "cpu"
    Knobs = AttentionCpuKnobs

    def decline(self, sch, block, target):
        return symbolic_rows_reason(sch, block)

    def transferable_knobs(self, static):
        """Everything but ``query_tile``: the micro-kernels' row steps and vector splits tile the key block and
        head dim (both in the signature), ``unroll`` is per task. A query tile tuned at one static length is
        not known good for run-time lengths: symbolic rows are padded to it, so its cost depends on the
        request; the symbolic default (:data:`SYMBOLIC_QUERY_TILE`) stays."""
        return {k: v for k, v in static.items() if k != "query_tile"}

    def schedule(self, sch, block, target, knobs=None):
        attention_cpu(sch, block, target, knobs)

    def prepare_operator(self, call, target):
        """Query rows padded to the query tile (``query_block``, ops/attention.py), so the flash loop's tiles
        carry no tail: rows known only at run time, and static rows that do not fill whole tiles. A tail tile
        predicates every stage under the flash loop: ViT-B/16's 197 rows (12 heads × 64) ran 2.7 ms with a
        5-row tail against 0.9 ms at 200 rows. One static query row takes the operator's split-K decode form
        instead (``split_blocks``, scheduled by :mod:`.decode_attention`)."""
        tile = QUERY_TILES[self.knobs.query_tile] if self.knobs.query_tile is not None else None
        padded = pad_symbolic_queries(call, tile or SYMBOLIC_QUERY_TILE)
        if padded is not None or call.op != "fused_attention" or call.params.get("query_block") is not None:
            return padded
        rows = int(call.inputs["q"].ty.shape[2 if call.params.get("q_layout", "BSHD") == "BHSD" else 1])
        if rows == 1 and "cu_seqlens" not in call.inputs and call.params.get("split_blocks") is None:
            # one query row (a decode step built for static rows): the split-K decode form, its own template
            keys = call_keys(call.inputs, call.params)
            keys = int(keys) if isinstance(keys, tirx.IntImm) else keys
            return call.replace(params=decode_params(call.params, keys))
        tile = tile or default_query_tile(rows)
        return call.replace(params=dict(call.params, query_block=tile)) if rows % tile else None
