"""CPU template for ``fused_dense``: a register-blocked GEMM micro-kernel with a fused epilogue.

Loop nest (outer to inner)::

    par = fuse(ip, j0)        parallel over output tiles (M split ip ways × N/nr column panels)
      i0                      row tiles of mr rows inside the task
        acc[mr, nr] = 0       accumulator tile: small enough for LLVM to keep in vector registers
        k0, k1                K loop outside the micro-kernel (k1: the unrolled k-block)
          i1 (unrolled, mr)   one broadcast of x per row ...
            j1 (vector, nr)   ... times one nr-wide panel row of W: mr*nr/8 FMAs per k
        write-back            bias + activation + cast, vectorised over nr, straight from the tile

W is read from the pre-packed (N/nr, K, nr) layout when the build path packed it (constant weights): the
micro-kernel then streams one contiguous panel, the way BLIS/ORT kernels do; nr is the layout's and not a
knob. With a plain (K, N) weight nr is a knob. A transposed plain weight (N, K) is read with stride K per
lane, which is correct but slow; the build path packs every constant weight, so only runtime weights see it.

Knobs (``sample_perfect_tile`` decisions unless said otherwise):
    ``i``: [ip, i0, mr]   ``j``: [j0, nr] (plain weights only)   ``k``: [k0, kc]
    ``unroll``: index into :data:`UNROLL_STEPS` (``sample_categorical``).
Odd sizes get exact tiles (divisors), except a packed N, whose last panel is zero-padded and predicated.

int8 (``fused_dense_int8``) on a CPU with a dot-product instruction: the constant weight is packed in k-groups
(``dot_panels``, ops/dense_int8.py) and the loop nest gains the k inside a group (``kk``) innermost; the
``lanes`` columns × ``kk`` under each row are one instruction (tensorized, schedules/cpu/dot_intrin.py). The
accumulator spans the zero-padded last panel (no predicate in the micro-kernel), so the rows are always padded to
the register tile (``row_block``) and the write-back, under the row tile, stops at N.

bf16 (``fused_dense`` on bfloat16 bit patterns) on a CPU with AVX512_BF16: the same loop nest on k-pair panels,
each 16 columns × 2 k one ``vdpbf16ps`` into fp32 accumulators; the function carries the LLVM IR that types the
instruction's bfloat16 operands (``pragma_import_llvm``, see dot_intrin.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import tvm
from tvm import relax, s_tir

from ...ops.dense import pack_weight
from ...ops.dense_int8 import pack_dot_panels
from ...targets import TargetInfo
from ..common import (
    PREFETCH_KEY,
    divisors,
    flatten_rows_map,
    has_symbolic_rows,
    inline_consumers,
    knob_decision,
    op_params,
    padded_rows_stage,
    prefetch_annotation,
    static_extents_reason,
)
from ..rule import Knobs, TemplateRule
from .dot_intrin import IMPORT_LLVM_KEY, DotKernel, bf16_dot_kernel, dpbf16ps_wrapper, int8_dot_kernel, register

#: 16 ymm registers (AVX2) bound the accumulator tile: mr*nr/8 + nr/8 + 1 <= 16.
MR_MAX = 8
NR_MAX = 64
KC_MAX = 512
UNROLL_STEPS = (0, 16, 64, 256)
#: rows per register tile when the row count is symbolic (the operator's ``row_block``; knob ``mr``), AVX2
SYMBOLIC_MR = 4
PACK_NR = 16

# AVX-512 has 32 registers of 16 lanes: the AVX2 tile (4 rows × 16 columns) is 4 accumulators there, and 4
# independent FMA chains cannot cover the FMA latency on two ports. 8 rows × 32 columns (16 accumulators) is the
# tile ORT's kernels use too. Measured on a 2-core Emerald Rapids (fused_dense + GELU, pre-packed weight, default
# knobs otherwise, one process, interleaved): 128x384x1536 0.89-0.94 ms with the AVX2 tile, 0.52-0.55 ms with
# 8 × 32 (ORT 0.65-0.68 ms); 128x1536x384 1.03 against 0.67 ms (ORT 0.68).
_WIDE_PACK_NR = (32, 16, 64, 8)
_WIDE_MR = (8, 6, 4, 5, 7, 3, 2)


def wide_vectors(target: Optional[tvm.target.Target]) -> bool:
    return target is not None and TargetInfo.of(target).lanes() >= 16


def pack_nr(n: int, target: Optional[tvm.target.Target] = None) -> int:
    """Panel width used when the build path pre-packs a constant (K, n) weight for this template."""
    if wide_vectors(target):
        # wide panels, but two per core at least: the panels are the parallel tasks when rows are few
        fits = [nr for nr in _WIDE_PACK_NR if n % nr == 0]
        tasks = 2 * TargetInfo.of(target).cores
        if fits:
            return next((nr for nr in fits if n // nr >= tasks), fits[0])
    for nr in (16, 24, 32, 8):
        if n % nr == 0:
            return nr
    lanes = TargetInfo.of(target).lanes() if target is not None else 8
    return PACK_NR if n >= PACK_NR else lanes


def dot_nr(n: int, dot: DotKernel, target: Optional[tvm.target.Target] = None) -> int:
    """Panel width of an int8 ``dot_panels`` weight: :func:`pack_nr`'s, rounded up to whole instructions."""
    nr = pack_nr(n, target)
    return -(-nr // dot.lanes) * dot.lanes


def default_mr(m: int, target: Optional[tvm.target.Target] = None) -> int:
    # AVX2: prefer 4..6 rows (8..12 accumulators with nr=16); AVX-512: 8 rows (16 with nr=32). Else the largest
    # divisor that fits the registers.
    ds = [d for d in divisors(m) if d <= MR_MAX]
    for want in _WIDE_MR if wide_vectors(target) else (4, 6, 5, 8, 3, 7, 2):
        if want in ds:
            return want
    return max(ds)


def row_block_for(call, knobs_mr: Optional[int], knobs_i, target: Optional[tvm.target.Target]) -> Optional[int]:
    """The ``row_block`` a dense-like operator should pad its rows to, or None to keep them as they are.

    Rows known only at run time are always padded (to the ``mr`` knob or :func:`symbolic_mr`). Static rows are
    tiled exactly, by a divisor, so a row count with no divisor near the register tile gets a thin tile: 197 rows
    (ViT-B/16's 196 patches + CLS) are prime, and 1-row tiles ran ViT's dense layers at 80 GFLOP/s against 260 for
    128 rows. Such rows are padded to the symbolic tile instead (a few wasted rows, the full register tile),
    unless a tuning record fixed the static row split (``i``)."""
    if has_symbolic_rows(call):
        static = 1
        for d in call.inputs["x"].ty.shape.values[:-1]:
            static *= int(d) if isinstance(d, tvm.tirx.IntImm) else 1
        return provable_row_block(static, int(knobs_mr or symbolic_mr(target)))
    if knobs_i is not None:
        return None
    m = 1
    for d in call.inputs["x"].ty.shape.values[:-1]:
        m *= int(d)
    return symbolic_mr(target) if m > MR_MAX and default_mr(m, target) < THIN_MR else None


def static_row_block(call, target: Optional[tvm.target.Target]) -> int:
    """The register tile of a static row count, for an operator whose rows are always padded (the tile divides
    them when :func:`row_block_for` did not ask for padding)."""
    m = 1
    for d in call.inputs["x"].ty.shape.values[:-1]:
        m *= int(d)
    return default_mr(m, target)


#: a static row tile thinner than this (the best divisor of the rows) is replaced by padding the rows
THIN_MR = 4


def provable_row_block(static: int, mr: int) -> int:
    """A row tile near ``mr`` for symbolic rows ``static · b`` whose padding TVM can reason about.

    Rows padded to ``(c·b + mr - 1) // mr · mr`` are canonicalised by TVM's analyzer through the common factor of
    ``c`` and ``mr`` (``(4b + 7) // 8`` becomes ``(b + 1) // 2``), after which it cannot prove the real rows lie
    inside the padded ones, so the schedule state calls the scope no stage pipeline and the template fails
    (MobileViT's patches, 4 per batch row; CLIP's 50 tokens under a dynamic batch). A tile that divides ``c``
    (no padding at all) or shares no factor with it proves fine: the divisor of ``c`` nearest ``mr`` within
    [THIN_MR, MR_MAX], else the coprime tile nearest ``mr``."""
    if static <= 1 or static % mr == 0 or math.gcd(static, mr) == 1:
        return mr
    near = sorted(range(THIN_MR, MR_MAX + 1), key=lambda r: (abs(r - mr), -r))
    for r in near:
        if static % r == 0:
            return r
    return next(r for r in near if math.gcd(static, r) == 1)


def symbolic_mr(target: Optional[tvm.target.Target] = None) -> int:
    """Rows per register tile (the operator's ``row_block``) when the rows are known only at run time."""
    return MR_MAX if wide_vectors(target) else SYMBOLIC_MR


def default_nr(n: int) -> int:
    ds = [d for d in divisors(n) if d <= NR_MAX]
    for want in (16, 24, 32, 8, 48, 40, 56, 64):
        if want in ds:
            return want
    return max(ds)


def default_kc(k: int) -> int:
    ds = [d for d in divisors(k) if d <= KC_MAX]
    best = max(ds)
    # A k-block this short would reload the accumulators every few FMAs: no blocking beats that.
    return best if best >= 64 or best == k else k


#: x (rows × K) larger than this no longer stays in the shared L3 while every column panel streams it ...
X_RESIDENT_BYTES = 8 << 20
#: ... so the rows are cut into blocks of about this size, each reused by all panels from L2/L3 (measured at
#: 7968×768×3072, BERT-base's FFN at batch 16 × 498 tokens: 1.5× at ~1 MiB blocks, the same at 300 KiB)
ROW_BLOCK_BYTES = 1 << 20


#: weight panels a symbolic-rows task keeps in L2 while a row tile of x (in L1) meets each of them
PANEL_GROUP_BYTES = 512 << 10
PANEL_GROUP_MAX = 8


def panel_group(n_tiles: int, panel_bytes: int, cores: int) -> int:
    """Column panels per task when the rows are symbolic (no static row blocking is possible): the most panels
    (a divisor of ``n_tiles``, at most :data:`PANEL_GROUP_MAX`) whose weights fit :data:`PANEL_GROUP_BYTES` and
    that still leave 4 tasks per core, as many on each core. With one panel per task, every panel re-reads all of
    x: from DRAM once x outgrows the cache (BERT-base at 16 × 498 tokens: 24 MiB). Uneven tasks leave a core idle:
    MiniLM's QKV projection (36 panels) in groups of 4 is 9 tasks, 5 on one core and 4 on the other, measured 1.09–
    1.18× the static kernel at 16 / 48 / 128 rows; in groups of 3 (12 tasks) 1.02–1.07× (a 2-core Xeon)."""
    best = 1
    for g in divisors(n_tiles):
        tasks = n_tiles // g
        if g <= PANEL_GROUP_MAX and g * panel_bytes <= PANEL_GROUP_BYTES and tasks >= 4 * cores and tasks % cores == 0:
            best = g
    return best


def _itemsize(sch: s_tir.Schedule, block) -> int:
    return tvm.DataType(sch.get(block).reads[0].source.dtype).bits // 8


def default_ip(m_tiles: int, n_tiles: int, cores: int, tile_bytes: int = 0) -> int:
    """Split the rows across tasks when the column panels alone cannot keep every core busy, or when x
    (``m_tiles`` row tiles of ``tile_bytes``) is too large to be re-read from cache by every column panel."""
    if tile_bytes and m_tiles * tile_bytes > X_RESIDENT_BYTES:
        for d in divisors(m_tiles):
            if m_tiles // d * tile_bytes <= ROW_BLOCK_BYTES:
                return d
    want = 4 * cores
    if n_tiles >= want:
        return 1
    for d in divisors(m_tiles):
        if d * n_tiles >= want:
            return d
    return m_tiles


def loop_extent(sch: s_tir.Schedule, loop):
    """The loop's extent: an ``int``, or the ``PrimExpr`` of a symbolic one (rows = batch × sequence)."""
    extent = sch.get(loop).extent
    return int(extent) if isinstance(extent, tvm.tirx.IntImm) else extent


def _packed_nr(sch: s_tir.Schedule, block) -> Optional[int]:
    """nr of a packed-layout ``fused_dense`` (from the op's params, not guessed from shapes: a batched
    matmul handed to this template by the fallback also has a 3-D right operand)."""
    if op_params(sch).get("w_layout") not in ("packed", "dot_panels"):
        return None
    return int(sch.get(block).reads[1].source.shape[2])


def read_padded_rows_in_place(sch: s_tir.Schedule, block) -> None:
    """Rows known only at run time: the micro-kernel reads x where it lies, the padding rows clamped to the last
    real one (the ``dense_rows`` stage inlined). Mapping a flat row to x's (batch, seq) dims takes a 64-bit
    division, but once per row of a tile, outside the K loop (LLVM hoists it). An earlier version copied the padded
    rows into a [rows, K] buffer first: a second parallel loop and a workspace per call, measured on a 2-core
    Xeon (AVX-512, symbolic kernel / static kernel, interleaved): 1.27 / 1.16 / 1.13 at 16 / 48 / 128 rows
    (K = 1536, N = 384) with the copy, 0.97 / 0.99 / 1.02 in place; AVX2 code on the same machine 1.13 → 0.98 at
    16 rows."""
    padded_rows = padded_rows_stage(sch, block)
    if padded_rows is not None:
        sch.compute_inline(padded_rows)


def _is_bf16_bits(sch: s_tir.Schedule, block) -> bool:
    return str(sch.get(block).reads[0].source.dtype) == "uint16"


def _dot_kernel(sch: s_tir.Schedule, block, target) -> Optional[DotKernel]:
    """The dot-product kernel of a ``dot_panels`` weight (int8: ops/dense_int8.py; bf16 bit patterns:
    ops/dense.py), None for other layouts."""
    if op_params(sch).get("w_layout") != "dot_panels":
        return None
    return bf16_dot_kernel(target) if _is_bf16_bits(sch, block) else int8_dot_kernel(target)


def dot_panels_reason(sch: s_tir.Schedule, block, target) -> Optional[str]:
    """Why the template cannot run a ``dot_panels`` weight on ``target`` (its panels were cut for another CPU)."""
    if op_params(sch).get("w_layout") != "dot_panels":
        return None
    bf16 = _is_bf16_bits(sch, block)
    kernel = bf16_dot_kernel(target) if bf16 else int8_dot_kernel(target)
    _, _, nr, group = (int(d) for d in sch.get(block).reads[1].source.shape)
    x_dtype = str(sch.get(block).reads[0].source.dtype)
    if kernel is None or kernel.group != group or nr % kernel.lanes or x_dtype != kernel.a_dtype:
        kind = "bf16" if bf16 else "int8"
        have = kernel.instruction if kernel else f"no {kind} dot-product instruction"
        return (f"{kind} weight packed in {group}-k groups of {nr} columns, {x_dtype} activations; this target has "
                f"{have}")
    return None


def dense_cpu(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, target: tvm.target.Target,
              knobs: Optional[dict] = None) -> None:
    knobs = knobs or {}
    packed_nr = _packed_nr(sch, block)
    dot = _dot_kernel(sch, block, target)
    read_padded_rows_in_place(sch, block)

    # dot_panels: the k inside a group (kk) stays innermost, under the columns, for the dot-product instruction
    *batch, j, k = sch.get_loops(block)[:-1] if dot else sch.get_loops(block)
    if not batch:
        batch = [sch.add_unit_loop(j)]  # x is a vector: one row
    batch_shape = [loop_extent(sch, lp) for lp in batch]
    idx_dtype = str(sch.get(j).extent.ty)
    if len(batch) > 1:
        # Rows are the flattened batch dims. Flatten the block's iteration space (not just its loops): the
        # accumulator tile and its write-back must be rectangles in (row, col), else compute-at regions are
        # bounding boxes in (b, s) that spill over into rows of other tiles.
        sch.transform_block_layout(block, flatten_rows_map(batch_shape, 3 if dot else 2, idx_dtype))
        *_, i, j, k = sch.get_loops(block)[:-1] if dot else sch.get_loops(block)
    else:
        i = batch[0]
    M, N, K = loop_extent(sch, i), loop_extent(sch, j), loop_extent(sch, k)
    kk = sch.get_loops(block)[-1:] if dot else []
    if packed_nr is None:
        nr = default_nr(N)
        j_dec = knob_decision(knobs.get("j"), [N // nr, nr])
        j0, j1 = sch.split(j, sch.sample_perfect_tile(j, n=2, max_innermost_factor=max(NR_MAX, j_dec[-1]),
                                                      decision=j_dec))
        n_tiles = N // nr
    else:
        # Layout-fixed panel width; a partial last panel is predicated (its padding is zeros).
        j0, j1 = sch.split(j, [None, packed_nr])
        n_tiles = loop_extent(sch, j0)

    kc = default_kc(K)
    k_dec = knob_decision(knobs.get("k"), [K // kc, kc])
    k0, k1 = sch.split(k, sch.sample_perfect_tile(k, n=2, max_innermost_factor=max(KC_MAX, k_dec[-1]),
                                                  decision=k_dec))
    row_block = op_params(sch).get("row_block")
    if row_block is None:
        mr = default_mr(M, target)
        ip = default_ip(M // mr, n_tiles, TargetInfo.of(target).cores,
                        mr * K * _itemsize(sch, block))
        i_dec = knob_decision(knobs.get("i"), [ip, M // (ip * mr), mr])
        ip_, i0, i1 = sch.split(i, sch.sample_perfect_tile(i, n=3, max_innermost_factor=max(MR_MAX, i_dec[-1]),
                                                           decision=i_dec))
        sch.reorder(ip_, j0, i0, k0, k1, i1, j1, *kk)
    else:
        # Rows known only at run time: the operator padded them to a multiple of row_block (= mr), so the
        # row tiles split exactly and the micro-kernel carries no tail predicate; column panels are the
        # parallel tasks. Only the write-back of the last tile is predicated (see _write_back_real_rows).
        i0, i1 = sch.split(i, [None, int(row_block)])
        group = panel_group(n_tiles, K * loop_extent(sch, j1) * _itemsize(sch, block), TargetInfo.of(target).cores)
        if group > 1:
            # a task runs `group` column panels under each row tile: x is streamed once per group, not per panel
            par, tile = sch.split(j0, [None, group])
            if dot is None:
                vectors = panel_row_vectors(loop_extent(sch, j1) * _itemsize(sch, block), target)
            else:  # a dot-product instruction fills one accumulator per `lanes` columns
                vectors = loop_extent(sch, j1) // dot.lanes
            side = side_by_side_panels(int(row_block), group, vectors)
            if side > 1:
                tile, beside = sch.split(tile, [None, side])
                sch.reorder(par, i0, tile, k0, k1, i1, beside, j1, *kk)
                sch.unroll(beside)
            else:
                sch.reorder(par, i0, tile, k0, k1, i1, j1, *kk)
        else:
            par, tile = j0, i0
            sch.reorder(j0, i0, k0, k1, i1, j1, *kk)
        prefetch_next_task(sch, block, k1, group, row_block)
        epilogue = _write_back_real_rows(sch, block, tile, idx_dtype)
        # LoopPartition then separates the full row tiles from the last one: a predicate in the write-back
        # keeps LLVM from vectorising the epilogue (GELU costs ~40 flops per element)
        sch.annotate(i0, "pragma_loop_partition_hint", 1)
        return _finish(sch, block, par, i1, j1, k0, knobs, epilogue, dot)

    prefetch_next_task(sch, block, k1, 1)
    # The mr×nr accumulator tile lives under the row-tile loop; the write-back applies the epilogue from it.
    acc = sch.cache_write(block, 0, "local")
    inline_consumers(sch, acc)
    if len(batch_shape) > 1:
        sch.transform_layout(block, ("write", 0), flatten_rows_map(batch_shape, 1, idx_dtype))
        sch.transform_block_layout(acc, flatten_rows_map(batch_shape, 1, idx_dtype))
    sch.reverse_compute_at(acc, i0, preserve_unit_loops=True)
    _finish(sch, block, sch.fuse(ip_, j0), i1, j1, k0, knobs, acc, dot)


#: accumulator vectors a thin row tile should keep in flight (see :func:`side_by_side_panels`)
THIN_TILE_ACCUMULATORS = 8


def panel_row_vectors(row_bytes: int, target: Optional[tvm.target.Target]) -> int:
    """Accumulator vectors one row of a weight panel fills on ``target``."""
    return max(1, row_bytes * 8 // TargetInfo.of(target).vector_bits)


def side_by_side_panels(row_block: int, group: int, vectors_per_panel: int = 2) -> int:
    """Column panels a row tile of ``row_block`` rows reads in the same k step. One row against one 16-column
    panel is two accumulator chains, each waiting on the FMA latency at every k, and one stream of weights: the
    core then reads about two thirds of what the memory gives it. Panels side by side add independent chains and
    streams; each output still sums over K in the same order."""
    side = 1
    for d in divisors(group):
        if row_block * vectors_per_panel * d <= THIN_TILE_ACCUMULATORS:
            side = d
    return side


#: row tiles this thin (a decode step's one or two rows per call) stream their weights without the next task's
#: prefetch: see :func:`prefetch_next_task`
STREAMING_ROW_BLOCK = 2


def prefetch_next_task(sch: s_tir.Schedule, block, k_steps, panels_ahead: int, row_block=None) -> None:
    """Each k step prefetches its row of the panel this thread's next task reads (``panels_ahead`` panels on), so
    that task does not wait on DRAM for its first row tile (compile/codegen/weight_prefetch.py). Packed weights only: a
    plain (K, N) weight's next columns are not the next bytes.

    Not for row tiles of at most :data:`STREAMING_ROW_BLOCK` rows (``row_block``): such a kernel reads each panel once,
    a few FMAs per byte, and the hardware's stream prefetchers keep up with it; a software prefetch only adds a
    stream per task. LLaMA-1024's dense and gated dense kernels alone, weights cold, calls of the two builds
    interleaved (2-core Zen 3 VM): without it 1-14 % faster at one and two rows, with it 8-12 % faster at four."""
    if row_block is not None and int(row_block) <= STREAMING_ROW_BLOCK:
        return
    if op_params(sch).get("w_layout") == "packed":
        sch.annotate(k_steps, PREFETCH_KEY, prefetch_annotation(sch.get(block).reads[1].source.name, panels_ahead))


def _write_back_real_rows(sch: s_tir.Schedule, block, tile_loop, idx_dtype: str):
    """Symbolic rows: the epilogue, rows flattened, runs under each row tile and reads the accumulator tile
    in registers. (Reverse-inlining it into the padded accumulator's write-back, as the static path does,
    would drop the bound on the real rows and write past the output.)"""
    epilogue = sch.get_consumers(block)[0]
    loops = sch.get_loops(epilogue)
    if len(loops) > 2:
        sch.transform_block_layout(epilogue, flatten_rows_map([sch.get(lp).extent for lp in loops[:-1]], 1,
                                                             idx_dtype))
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, tile_loop, preserve_unit_loops=True)
    sch.reverse_compute_at(epilogue, tile_loop, preserve_unit_loops=True)
    sch.compute_inline(acc)
    return epilogue


def _finish(sch: s_tir.Schedule, block, par, i1, j1, k0, knobs, write_back, dot: Optional[DotKernel] = None) -> None:
    """Parallel tasks, the register micro-kernel (rows unrolled, columns vectorised or, with a dot-product kernel,
    one instruction per ``lanes`` columns), the write-back."""
    sch.parallel(par)
    wb_loops = sch.get_loops(write_back)
    sch.unroll(wb_loops[-2])
    sch.vectorize(wb_loops[-1])
    sch.unroll(i1)
    if dot is None:
        sch.vectorize(j1)  # before decompose_reduction: the init block inherits the vector loop
        init = sch.decompose_reduction(block, k0)
        sch.unroll(sch.get_loops(init)[-2])
    else:
        j1v, j1l = sch.split(j1, [None, dot.lanes])
        sch.unroll(j1v)
        init = sch.decompose_reduction(block, k0)
        *_, init_rows, init_vectors, init_lanes = sch.get_loops(init)
        sch.unroll(init_rows)
        sch.unroll(init_vectors)
        sch.vectorize(init_lanes)
        sch.tensorize(j1l, register(dot))
        if dot.operands == "bf16":
            sch.annotate(par, IMPORT_LLVM_KEY, dpbf16ps_wrapper(dot))

    u = sch.sample_categorical(list(UNROLL_STEPS), [1.0 / len(UNROLL_STEPS)] * len(UNROLL_STEPS),
                               decision=knobs.get("unroll", 1))
    sch.annotate(par, "pragma_auto_unroll_max_step", u)
    sch.annotate(par, "pragma_unroll_explicit", 1)


def row_independent_knobs(static: dict, names) -> dict:
    """The knobs ``names`` of a static record, plus its register-tile row count as ``mr``."""
    out = {name: static[name] for name in names if name in static}
    if static.get("i"):
        out["mr"] = int(static["i"][-1])
    return out



@dataclass(frozen=True)
class DenseCpuKnobs(Knobs):
    i: Optional[Sequence[int]] = None       # [ip, i0, mr] (static rows)
    mr: Optional[int] = None                # symbolic rows: rows per register tile (the operator's row_block)
    j: Optional[Sequence[int]] = None       # [j0, nr] (plain weights only)
    k: Optional[Sequence[int]] = None       # [k0, kc]
    unroll: Optional[int] = None            # index into UNROLL_STEPS


class DenseCPU(TemplateRule):
    """``fused_dense`` (and leftover matmuls, through the fallback) on CPU: register-blocked micro-kernel."""

    block_rule = "tfx.dense"
    family = "cpu"
    Knobs = DenseCpuKnobs

    def decline(self, sch, block, target):
        # rows may be symbolic (batch × sequence); the panel layout needs static columns and reduction
        dot = op_params(sch).get("w_layout") == "dot_panels"
        *_, j, k = sch.get_loops(block)[:-1] if dot else sch.get_loops(block)  # dot_panels: k-groups, then k
        return static_extents_reason(sch, (("columns", j), ("reduction", k))) or dot_panels_reason(sch, block, target)

    def schedule(self, sch, block, target, knobs=None):
        dense_cpu(sch, block, target, knobs)

    def transferable_knobs(self, static):
        """``k`` (K static in both), ``j`` (N), ``unroll``; a static row split's register tile ``i[-1]`` is the
        symbolic path's ``mr``. The row split itself (``ip``, ``i0``) is a tiling of the tuned row count."""
        return row_independent_knobs(static, ("j", "k", "unroll"))

    def prepare_operator(self, call, target):
        """Constant weights (fp32, bf16 or int8) pre-packed into the (N/nr, K, nr) panels the micro-kernel
        streams; rows known only at run time, or static rows with no divisor near the register tile, padded to it
        (``row_block``, see ops/dense.py and :func:`row_block_for`)."""
        if call.op not in ("fused_dense", "fused_dense_int8"):  # int8: ops/dense_int8.py, same loop nest
            return None
        inputs, params = {}, dict(call.params)
        w = call.constant("w")
        if call.op == "fused_dense_int8":
            dot = int8_dot_kernel(target)
        else:  # bf16 bit patterns (compile/precision.py) where the target multiplies bf16 pairs
            dot = bf16_dot_kernel(target) if w is not None and str(w.dtype) == "uint16" else None
        if dot is not None and params.get("w_layout", "plain") == "plain" and w is not None \
                and int(w.shape[0]) >= dot.group and str(call.inputs["x"].ty.dtype) == dot.a_dtype:
            n = int(w.shape[1])
            inputs["w"] = relax.const(pack_dot_panels(w, dot_nr(n, dot, target), dot.group))
            params.update(w_layout="dot_panels", out_features=n)
            if params.get("row_block") is None:
                # The accumulator covers the zero-padded last panel, so that the micro-kernel has no predicate;
                # its write-back runs under the row tile and stops at N, which only the padded-rows form
                # (a 2-D accumulator, see _write_back_real_rows) bounds. A static row count is tiled by a
                # divisor when one is near the register tile (no padding, no clamp). "min": the dot-product
                # intrinsic reads a row of x as one region, which a branch-hinted clamp makes a range of rows.
                row_block = row_block_for(call, self.knobs.mr, None, target) or static_row_block(call, target)
                params.update(row_block=row_block, row_clamp="min")
        elif params.get("w_layout", "plain") == "plain" and w is not None:  # a run-time weight is read in place
            transpose_b = bool(params.get("transpose_b", False))
            n = int(w.shape[0] if transpose_b else w.shape[1])
            inputs["w"] = relax.const(pack_weight(w, pack_nr(n, target), transpose_b))
            params.update(w_layout="packed", out_features=n)
            if "transpose_b" in params or call.op == "fused_dense":
                params["transpose_b"] = False
        if params.get("row_block") is None:
            row_block = row_block_for(call, self.knobs.mr, self.knobs.i, target)
            if row_block is not None:
                params.update(row_block=row_block, row_clamp="likely")  # see ops/dense.py::real_row
        return call.replace(inputs=inputs, params=params) if params != call.params else None
