"""CUDA template for ``fused_dense``.

fp32 inputs: a SIMT shared-memory GEMM::

    blockIdx.y, blockIdx.x      block tile  BM × BN = (ty·yi) × (tx·xi)
      threadIdx.y, threadIdx.x  one thread owns a yi × xi accumulator tile, kept in registers
        ko                      K in steps of kc: the BM × kc tile of x and the kc × BN tile of W are
                                staged in shared memory by all threads, with vector loads of ``vec`` elements
          ki, yi, xi            register-blocked FMAs from shared memory
        write-back              bias + activation + cast straight from the registers

fp16 / bf16 inputs with M, N, K multiples of 16: the tensor-core path of :mod:`.tensorcore` (mma.sync
m16n8k16, fp32 accumulation); other fp16/bf16 shapes take the SIMT path, which accumulates in fp32 too.
``fused_dense_int8`` (uint8 activations, an (N, K) int8 weight) with M, N multiples of 16 and K of 32: the same
template with :mod:`.tensorcore_int8`'s operands (mma.sync m16n8k32 u8 × s8, int32 accumulation); SIMT otherwise.
The path follows dtype and shape, static properties of the PrimFunc, never a knob.

Knobs (``sample_perfect_tile`` decisions unless said otherwise), fp32:
    ``i``: [by, ty, yi]   ``j``: [bx, tx, xi]   ``k``: [ko, kc]
    ``vec``: index into :data:`VECTOR_WIDTHS`   ``unroll``: index into :data:`UNROLL_STEPS`
Defaults are chosen per shape from the target's limits (threads and shared memory per block).

Rows known only at run time (dynamic batch × sequence): :meth:`DenseCUDA.prepare_operator` asks the operator
to pad them to :data:`SYMBOLIC_ROW_BLOCK` (``row_block``), so the row loop splits into whole ``ty × yi``
tiles, ``blockIdx.y`` takes the symbolic tile count, and only the epilogue is predicated on the real rows.
That path is SIMT for every dtype (the tensor-core path needs static 16-multiples); ``i`` is then
``[_, ty, yi]`` with ``ty × yi`` dividing the row block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import tvm
from tvm import s_tir

from ...targets import TargetInfo
from ..common import (
    flatten_block_rows,
    flatten_rows_map,
    flatten_write_rows,
    inline_consumers,
    knob_decision,
    largest_divisor,
    op_params,
    pad_symbolic_rows,
    padded_rows_stage,
    static_extents_reason,
)
from ..rule import Knobs, TemplateRule
from . import tensorcore, tensorcore_int8

VECTOR_WIDTHS = (1, 2, 4)
UNROLL_STEPS = (0, 16, 64, 512)
#: Registers a thread may hold as accumulators: 4x4 keeps an fp32 kernel near 64 registers, well inside
#: the 255-register limit with the two operand fragments, so nothing spills.
THREAD_TILE = 4
#: Threads per block aimed at: 128 leaves room for several resident blocks per SM at these tile sizes.
TARGET_THREADS = 128
KC = 16
#: rows per tile when the row count is symbolic: one 8 × 4 thread-row tile, little work wasted on padding
SYMBOLIC_ROW_BLOCK = 32



def simt_defaults(M: int, N: int, K: int, lim: dict) -> dict:
    """Expert defaults: 4×4 register tiles, ~128 threads, kc=16, float4 loads where the tiles allow."""
    yi = largest_divisor(M, THREAD_TILE)
    xi = largest_divisor(N, THREAD_TILE)
    tx = largest_divisor(N // xi, min(16, lim["threads"]))
    ty = largest_divisor(M // yi, max(1, min(TARGET_THREADS, lim["threads"]) // tx))
    kc = largest_divisor(K, KC)
    threads = tx * ty
    # Widest vector that splits both staged tiles evenly across the threads and keeps every global
    # access aligned (rows of x and W start at multiples of K and N elements).
    vec = 0
    for n, w in enumerate(VECTOR_WIDTHS):
        if K % w == 0 and N % w == 0 and kc % w == 0 and (xi * tx) % w == 0 \
                and (yi * ty * kc) % (threads * w) == 0 and (xi * tx * kc) % (threads * w) == 0:
            vec = n
    return {"i": [M // (ty * yi), ty, yi], "j": [N // (tx * xi), tx, xi], "k": [K // kc, kc], "vec": vec,
            "unroll": 2}


def _input_dtype(sch: s_tir.Schedule, block) -> str:
    return str(sch.get(block).reads[0].source.dtype)


def _gemm_shape(sch: s_tir.Schedule, block):
    extents = [int(iv.dom.extent) for iv in sch.get(block).iter_vars]
    m = 1
    for e in extents[:-2]:
        m *= e
    return m, extents[-2], extents[-1]


def dense_cuda(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, target: tvm.target.Target,
               knobs: Optional[dict] = None) -> None:
    tiles = _tensor_core_tiles(sch, block, target)
    if tiles is not None:
        tensorcore.dense_mma(sch, block, target, knobs, tiles)
    else:
        dense_simt(sch, block, target, knobs)


def _tensor_core_tiles(sch: s_tir.Schedule, block, target: tvm.target.Target):
    """The tensor-core operands of this dense (fp16 / bf16, or u8 activations × s8 weights), None for SIMT."""
    if padded_rows_stage(sch, block) is not None or not TargetInfo.of(target).tensor_cores:
        return None
    (M, N, K), dtype = _gemm_shape(sch, block), _input_dtype(sch, block)
    trans_b = tensorcore.weight_is_transposed(sch, block)
    if dtype == "uint8":
        return tensorcore_int8.operand_tiles() if tensorcore_int8.supports(M, N, K, trans_b) else None
    return tensorcore.operand_tiles(dtype, trans_b) if tensorcore.supports(M, N, K, dtype) else None


def dense_simt(sch: s_tir.Schedule, block, target: tvm.target.Target, knobs: Optional[dict] = None) -> None:
    knobs = knobs or {}
    lim = TargetInfo.of(target).limits()
    padded_rows = padded_rows_stage(sch, block)
    if padded_rows is None:
        flatten_write_rows(sch, block)
        i, j, k = flatten_block_rows(sch, block, extra=2)
        M = int(sch.get(i).extent)
    else:
        i, j, k = sch.get_loops(block)  # already (padded rows, N, K)
        M = int(op_params(sch).get("row_block") or SYMBOLIC_ROW_BLOCK)
    N, K = (int(sch.get(lp).extent) for lp in (j, k))
    d = simt_defaults(M, N, K, lim)

    tj = sch.sample_perfect_tile(j, n=3, max_innermost_factor=8, decision=knob_decision(knobs.get("j"), d["j"]))
    tk = sch.sample_perfect_tile(k, n=2, max_innermost_factor=64, decision=knob_decision(knobs.get("k"), d["k"]))
    if padded_rows is None:
        ti = sch.sample_perfect_tile(i, n=3, max_innermost_factor=8, decision=knob_decision(knobs.get("i"), d["i"]))
    else:
        # a symbolic extent has no perfect tiles: the thread-row tile is fixed, the tile count is the rest
        ti = [None, *knob_decision(knobs.get("i"), d["i"])[1:]]
        if M % (ti[1] * ti[2]):
            raise ValueError(f"row tile {ti[1]}x{ti[2]} does not divide the row block {M}")
    by, ty, yi = sch.split(i, ti)
    bx, tx, xi = sch.split(j, tj)
    ko, ki = sch.split(k, tk)
    sch.reorder(by, bx, ty, tx, ko, ki, yi, xi)
    sch.bind(by, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")

    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, tx, preserve_unit_loops=True)
    if padded_rows is None:
        inline_consumers(sch, acc)
    else:
        _write_back_real_rows(sch, acc, tx)

    vec = sch.sample_categorical(list(VECTOR_WIDTHS), [1.0 / len(VECTOR_WIDTHS)] * len(VECTOR_WIDTHS),
                                 decision=knobs.get("vec", d["vec"]))
    for idx in (0, 1):
        stage_in_shared(sch, block, idx, ko, ti[1], tj[1], vec)
        if idx == 0 and padded_rows is not None:
            sch.compute_inline(padded_rows)  # the fetch gathers the tile's rows straight from x

    sch.decompose_reduction(block, ko)
    u = sch.sample_categorical(list(UNROLL_STEPS), [1.0 / len(UNROLL_STEPS)] * len(UNROLL_STEPS),
                               decision=knobs.get("unroll", d["unroll"]))
    sch.annotate(by, "pragma_auto_unroll_max_step", u)
    sch.annotate(by, "pragma_unroll_explicit", 1)


def stage_in_shared(sch: s_tir.Schedule, block, idx: int, ko, ty, tx, vec) -> None:
    """Read ``idx`` of ``block`` through shared memory, one tile per step of ``ko``, fetched cooperatively by the
    ``ty × tx`` threads with ``vec``-wide accesses. The thread extents are random variables: reusing them keeps
    the fetch consistent with whatever tile the search picks."""
    shared = sch.cache_read(block, idx, "shared")
    sch.compute_at(shared, ko, preserve_unit_loops=True)
    fused = sch.fuse(*sch.get_loops(shared)[-len(sch.get(shared).writes[0].region):])
    _, fy, fx, fv = sch.split(fused, [None, ty, tx, vec])
    sch.bind(fy, "threadIdx.y")
    sch.bind(fx, "threadIdx.x")
    sch.vectorize(fv)


def _write_back_real_rows(sch: s_tir.Schedule, acc, tile_loop) -> None:
    """Symbolic rows: the epilogue (rows flattened) runs per thread tile from the registers and writes only
    the real rows. Inlining it into the padded accumulator's write-back instead would drop that bound."""
    (epilogue,) = sch.get_consumers(acc)
    loops = sch.get_loops(epilogue)
    if len(loops) > 2:
        idx_dtype = str(sch.get(loops[0]).extent.ty)
        sch.transform_block_layout(epilogue, flatten_rows_map([sch.get(lp).extent for lp in loops[:-1]], 1,
                                                             idx_dtype))
    sch.reverse_compute_at(epilogue, tile_loop, preserve_unit_loops=True)
    sch.compute_inline(acc)


@dataclass(frozen=True)
class DenseCudaKnobs(Knobs):
    i: Optional[Sequence[int]] = None       # SIMT [by, ty, yi]; tensor cores [bm, wm, fm] in 16-row tiles
    j: Optional[Sequence[int]] = None       # SIMT [bx, tx, xi]; tensor cores [bn, wn, fn] in 16-column tiles
    k: Optional[Sequence[int]] = None       # [ko, kc] (tensor cores: in 16-element tiles; int8: 32-byte tiles)
    vec: Optional[int] = None               # SIMT only: index into VECTOR_WIDTHS
    unroll: Optional[int] = None            # index into UNROLL_STEPS
    row_block: Optional[int] = None         # symbolic rows: rows per padded tile (the operator's row_block)


def simt_transferable_knobs(static: dict) -> dict:
    """The knobs of a static SIMT record that keep their meaning on symbolic rows: the column split ``j``, the K
    split ``k``, ``vec`` and ``unroll`` as they are, and the thread-row tile ``i[1:]`` (``ty × yi`` rows per
    block), which becomes the operator's ``row_block`` so that the padded rows split into whole tiles. A
    tensor-core record (no ``vec``: its tiles count 16 elements) transfers nothing: the symbolic path is SIMT."""
    if "vec" not in static or not static.get("i"):
        return {}
    out = {name: static[name] for name in ("j", "k", "vec", "unroll") if name in static}
    _, ty, yi = (int(v) for v in static["i"])
    out.update(i=[1, ty, yi], row_block=ty * yi)
    return out


class DenseCUDA(TemplateRule):
    """``fused_dense`` (and ``fused_dense_int8``) on CUDA: mma.sync tensor cores for fp16/bf16 in 16-multiples and
    for u8 × s8 in 16 × 16 × 32 tiles, a SIMT GEMM otherwise."""

    block_rule = "tfx.dense"
    family = "cuda"
    Knobs = DenseCudaKnobs

    def decline(self, sch, block, target):
        *_, j, k = sch.get_loops(block)
        reason = static_extents_reason(sch, (("columns", j), ("reduction", k)))
        if reason:
            return reason
        rows = [sch.get(lp).extent for lp in sch.get_loops(block)[:-2]]
        if padded_rows_stage(sch, block) is None and not all(isinstance(r, tvm.tirx.IntImm) for r in rows):
            return f"rows {rows} are symbolic and not padded to tiles (row_block)"
        return None

    def schedule(self, sch, block, target, knobs=None):
        dense_cuda(sch, block, target, knobs)

    def transferable_knobs(self, static):
        return simt_transferable_knobs(static)

    def prepare_operator(self, call, target):
        """Rows known only at run time padded to whole row tiles (``row_block``, see ops/dense.py). Not the int8
        dense: the SIMT template's padded-row write-back does not take its epilogue yet, so its symbolic rows are
        declined and take the fallback schedule."""
        return pad_symbolic_rows(call, "fused_dense", self.knobs.row_block or SYMBOLIC_ROW_BLOCK)
