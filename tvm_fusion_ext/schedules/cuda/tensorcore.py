"""Tensor cores for ``fused_dense`` on sm_80/sm_90: mma.sync m16n8k16, fp16/bf16 inputs, fp32 accumulation.

Why our own intrinsics rather than TVM's (``tvm.s_tir.tensor_intrin.cuda``):

* wmma with an fp32 accumulator fails in 0.27's LowerIntrin ("tvm_access_ptr element type must match the
  source buffer"): its fragment store passes an fp16-typed ``tvm_access_ptr`` for an fp32 buffer. Our store
  below is plain ``BufferStore``s from the per-thread accumulator registers into shared memory, so no
  ``tvm_access_ptr`` with a mismatched type is ever built.
* MetaSchedule's mma rule silently does not tensorize, so the template tensorizes explicitly.
* TVM's module registers 81 intrinsics on import (~30 s here) and has no bf16 ldmatrix/mma; we register the
  six we use, for fp16 and bf16.

Data flow per block tile (BM × BN), per K step of ``kc = 16·ki``::

    x, W (global)  --cooperative 16-byte loads-->  shared (rows padded by 8 halves: ldmatrix without
                                                   bank conflicts, rows still 16-byte aligned)
    shared         --ldmatrix.x4 (.trans for a (K, N) weight)-->  fragments (registers)
    fragments      --mma.sync.m16n8k16 ×2 per 16×16 tile-->       fp32 accumulators (registers)
    accumulators   --BufferStore-->  shared fp32 tile  --bias/activation/cast, vector stores-->  global

Fragments live in "local" buffers, not "warp" ones. A fragment is a 16×16 tile laid out as [32 lanes,
8 values] (:func:`fragment_layout`), so the schedule and the intrinsic descriptions speak about whole tiles,
but the implementations address only ``elem_offset + value``, never the lane: every thread keeps its own
8 values at the same local offsets. With "warp" scope, ``LowerWarpMemory`` would have to find the
``threadIdx.x * 8`` lane term in every offset, and 0.27 runs CommonSubexprElim first, which hoists that
term into a variable: the pass then leaves the fragments as 256-element per-thread arrays in local
memory (stack frames, or a failed check for multi-tile accumulators). With constant offsets after
unrolling, nvcc keeps each fragment in 4 (fp16 pairs) or 8 (fp32) registers.

Knobs (``sample_perfect_tile`` decisions, in 16-element tiles): ``i``: [bm, wm, fm] and ``j``: [bn, wn, fn]
(grid, warps, tiles per warp along M and N), ``k``: [ko, ki] (K steps, tiles per step); ``unroll``: index into
:data:`UNROLL_STEPS`. Used for fp16/bf16 when M, N and K are multiples of 16 (:func:`supports`), and for the
int8 dense with :mod:`.tensorcore_int8`'s operands (:class:`OperandTiles`: K in 32-byte tiles, int32 accumulators).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import tvm
from tvm import s_tir
from tvm.runtime import convert
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T
from tvm.tirx import Cast

from ...targets import TargetInfo
from ..common import flatten_block_rows, flatten_write_rows, inline_consumers, largest_divisor, op_params

WARP = 32
TILE = 16  # m = n = k = 16 per tensorized tile (two m16n8k16 instructions)
LOCAL = TILE * TILE // WARP  # values per lane of a 16×16 fragment
DTYPES = ("float16", "bfloat16")
_PTX_TYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
_SHORT = {"float16": "f16", "bfloat16": "bf16"}
#: halves of padding per shared row (16 bytes)
SMEM_PAD = 8
VEC = 8  # 16-byte global/shared loads of 16-bit elements
UNROLL_STEPS = (0, 16, 64, 512)
FRAG_SCOPE = "local"


def fragment_layout(i, j):
    """(row, col) of a 16×16 tile -> (lane, value) in the ldmatrix/mma fragment layout."""
    return 4 * (i % 8) + (j % 8) // 2, 4 * (j // 8) + (i // 8) * 2 + j % 2


def fragment_layout_inverse(lane, value):
    return 8 * (value % 4 // 2) + lane // 4, 8 * (value // 4) + (lane % 4) * 2 + value % 2


# ----------------------------------------------------------------------------------------------- intrinsics

def _ldmatrix(dtype: str, operand: str, trans: bool, sync: bool = False):
    """shared 16×16 -> warp fragment. ``operand`` "a": x tile (m, k); "b": weight tile, (k, n) or, with
    ``trans``, (n, k). mma wants B column-major, so a (k, n) tile is loaded with ldmatrix's .trans.

    ``sync``: a block-wide barrier before and after the load. TVM's ThreadSync sees neither ``address_of`` nor the
    asm, so it put no ``__syncthreads`` between the block's cooperative stores of a tile and the warps' ldmatrix
    reads, nor between those reads and the next K step's stores: on an H100 a warp read rows another warp had not
    written yet (the dense template's second warp along N got garbage, NaN). Only for templates whose every warp
    runs the same fragment loads (a barrier under a warp-dependent branch would hang)."""
    ldm_trans = operand == "b" and not trans
    half = convert(WARP // 2)
    if trans:  # lanes 0-7 / 8-15 / 16-23 / 24-31 address rows 0-7 / 0-7 (+8 cols) / 8-15 / 8-15 (+8 cols)
        row_col = lambda tx: (8 * (tx // half) + tx % 8, 8 * ((tx % half) // 8))  # noqa: E731
    else:  # lanes 0-15 address rows 0-15, lanes 16-31 the same rows 8 columns on
        row_col = lambda tx: (tx % half, 8 * (tx // half))  # noqa: E731

    @T.prim_func(s_tir=True)
    def desc(warp_h: T.handle, shared_h: T.handle) -> None:
        shared = T.match_buffer(shared_h, (TILE, TILE), dtype, align=64, offset_factor=TILE, scope="shared")
        warp = T.match_buffer(warp_h, (WARP, LOCAL), dtype, align=64, offset_factor=TILE, scope=FRAG_SCOPE)
        with T.sblock("root"):
            T.reads(shared[0:TILE, 0:TILE])
            T.writes(warp[0:WARP, 0:LOCAL])
            for a0, a1 in T.grid(TILE, TILE):
                with T.sblock("shared_warp"):
                    v0, v1 = T.axis.remap("SS", [a0, a1])
                    T.reads(shared[v0, v1])
                    lane, value = T.meta_var(fragment_layout(v0, v1))
                    T.writes(warp[lane, value])
                    warp[lane, value] = shared[v0, v1]

    @T.prim_func(s_tir=True)
    def impl(warp_h: T.handle, shared_h: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        shared = T.match_buffer(shared_h, (TILE, TILE), dtype, align=64, offset_factor=TILE, scope="shared",
                                strides=[s0, s1])
        warp = T.match_buffer(warp_h, (WARP, LOCAL), dtype, align=64, offset_factor=TILE, scope=FRAG_SCOPE)
        with T.sblock("root"):
            T.reads(shared[0:TILE, 0:TILE])
            T.writes(warp[0:WARP, 0:LOCAL])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                # the lane's row address as &shared[row, col], not tvm_access_ptr: once TVM merges shared
                # tiles of several types into one allocation (StorageRewrite, or the dynamic shared memory
                # merge), LowerIntrin checks an access_ptr's type against whichever alias it finds and fails
                row, col = T.meta_var(row_col(tx))
                if sync:
                    T.evaluate(T.tvm_storage_sync("shared"))
                T.evaluate(T.ptx_legacy.ldmatrix(ldm_trans, 4, ".b16", warp.data, warp.elem_offset,
                                                 T.address_of(shared[row, col]), 0, dtype=dtype))
                if sync:
                    T.evaluate(T.tvm_storage_sync("shared"))

    return desc, impl


def _mma(dtype: str, trans_b: bool):
    """C[16×16, fp32] += A[16×16] · B[16×16] as two m16n8k16 mma.sync (left and right 8 columns)."""
    ab = _PTX_TYPE[dtype]
    f32 = lambda v: Cast("float32", v)  # noqa: E731
    b_idx = (lambda k, n: (n, k)) if trans_b else (lambda k, n: (k, n))

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (WARP, LOCAL), dtype, align=64, offset_factor=TILE, scope=FRAG_SCOPE)
        B = T.match_buffer(b, (WARP, LOCAL), dtype, align=64, offset_factor=TILE, scope=FRAG_SCOPE)
        C = T.match_buffer(c, (WARP, LOCAL), "float32", align=64, offset_factor=TILE, scope=FRAG_SCOPE)
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:LOCAL], A[0:WARP, 0:LOCAL], B[0:WARP, 0:LOCAL])
            T.writes(C[0:WARP, 0:LOCAL])
            for i, j, k in T.grid(TILE, TILE, TILE):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    b0, b1 = T.meta_var(b_idx(vk, vj))
                    lc, xc = T.meta_var(fragment_layout(vi, vj))
                    la, xa = T.meta_var(fragment_layout(vi, vk))
                    lb, xb = T.meta_var(fragment_layout(b0, b1))
                    T.reads(C[lc, xc], A[la, xa], B[lb, xb])
                    T.writes(C[lc, xc])
                    C[lc, xc] = C[lc, xc] + f32(A[la, xa]) * f32(B[lb, xb])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (WARP, LOCAL), dtype, align=64, offset_factor=TILE, scope=FRAG_SCOPE)
        B = T.match_buffer(b, (WARP, LOCAL), dtype, align=64, offset_factor=TILE, scope=FRAG_SCOPE)
        C = T.match_buffer(c, (WARP, LOCAL), "float32", align=64, offset_factor=TILE, scope=FRAG_SCOPE)
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:LOCAL], A[0:WARP, 0:LOCAL], B[0:WARP, 0:LOCAL])
            T.writes(C[0:WARP, 0:LOCAL])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                T.evaluate(T.ptx_legacy.mma("m16n8k16", "row", "col", ab, ab, "fp32",
                                            A.data, A.elem_offset,
                                            B.data, B.elem_offset,
                                            C.data, C.elem_offset, False, dtype="float32"))
                T.evaluate(T.ptx_legacy.mma("m16n8k16", "row", "col", ab, ab, "fp32",
                                            A.data, A.elem_offset,
                                            B.data, B.elem_offset + LOCAL // 2,
                                            C.data, C.elem_offset + LOCAL // 2, False,
                                            dtype="float32"))

    return desc, impl


def _fill(acc: str = "float32"):
    @T.prim_func(s_tir=True)
    def desc(c: T.handle) -> None:
        C = T.match_buffer(c, (WARP, LOCAL), acc, scope=FRAG_SCOPE)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:WARP, 0:LOCAL])
            for i0, i1 in T.grid(TILE, TILE):
                with T.sblock("C_warp"):
                    i, j = T.axis.remap("SS", [i0, i1])
                    lane, value = T.meta_var(fragment_layout(i, j))
                    T.reads()
                    T.writes(C[lane, value])
                    C[lane, value] = T.cast(0, acc)

    @T.prim_func(s_tir=True)
    def impl(c: T.handle) -> None:
        C = T.match_buffer(c, (WARP, LOCAL), acc, scope=FRAG_SCOPE, offset_factor=1)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:WARP, 0:LOCAL])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                T.evaluate(T.cuda.mma_fill_legacy(LOCAL, C.data, C.elem_offset, dtype=acc))

    return desc, impl


def _store_shared(acc: str = "float32"):
    """Accumulators (fp32; int32 for int8) -> shared tile, as BufferStores (the module docstring says why not
    wmma or access_ptr)."""

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, c: T.handle) -> None:
        W = T.match_buffer(a, (WARP, LOCAL), acc, scope=FRAG_SCOPE)
        C = T.match_buffer(c, (TILE, TILE), acc, scope="shared")
        with T.sblock("root"):
            T.reads(W[0:WARP, 0:LOCAL])
            T.writes(C[0:TILE, 0:TILE])
            for i0, i1 in T.grid(TILE, TILE):
                with T.sblock("C_warp"):
                    v0, v1 = T.axis.remap("SS", [i0, i1])
                    lane, value = T.meta_var(fragment_layout(v0, v1))
                    T.reads(W[lane, value])
                    T.writes(C[v0, v1])
                    C[v0, v1] = W[lane, value]

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, c: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        W = T.match_buffer(a, (WARP, LOCAL), acc, scope=FRAG_SCOPE, offset_factor=1)
        C = T.match_buffer(c, (TILE, TILE), acc, scope="shared", offset_factor=1, strides=[s0, s1])
        with T.sblock("root"):
            T.reads(W[0:WARP, 0:LOCAL])
            T.writes(C[0:TILE, 0:TILE])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                for value in T.serial(LOCAL):
                    row, col = T.meta_var(fragment_layout_inverse(tx, value))
                    C[row, col] = W[0, value]

    return desc, impl


def intrin_names(dtype: str, trans_b: bool, sync: bool = False) -> dict:
    s, z = _SHORT[dtype], "_sync" if sync else ""
    return {"load_a": f"tfx_ldmatrix_{s}_a{z}", "load_b": f"tfx_ldmatrix_{s}_b{'_trans' if trans_b else ''}{z}",
            "compute": f"tfx_mma_{s}{s}f32{'_trans_b' if trans_b else ''}", "init": "tfx_mma_fill_f32",
            "store": "tfx_mma_store_f32_shared"}


_REGISTERED = False


def register_intrinsics() -> None:
    """Register our intrinsics (once; ~1.5 s of TVMScript parsing, so not at import: CPU builds load every
    template module)."""
    global _REGISTERED  # noqa: PLW0603
    if _REGISTERED:
        return
    TensorIntrin.register("tfx_mma_fill_f32", *_fill(), override=True)
    TensorIntrin.register("tfx_mma_store_f32_shared", *_store_shared(), override=True)
    for dtype in DTYPES:
        for sync in (False, True):
            for trans_b in (False, True):
                names = intrin_names(dtype, trans_b, sync)
                TensorIntrin.register(names["load_b"], *_ldmatrix(dtype, "b", trans_b, sync), override=True)
                TensorIntrin.register(names["compute"], *_mma(dtype, trans_b), override=True)
            TensorIntrin.register(intrin_names(dtype, False, sync)["load_a"], *_ldmatrix(dtype, "a", False, sync),
                                  override=True)
    _REGISTERED = True


# ----------------------------------------------------------------------------------------------- template

def supports(M: int, N: int, K: int, dtype: str) -> bool:
    return dtype in DTYPES and M % TILE == 0 and N % TILE == 0 and K % TILE == 0


@dataclass(frozen=True)
class OperandTiles:
    """What the template needs to know about one input dtype's mma: intrinsic names, K per tensorized tile,
    elements per 16-byte access (global loads, shared-row padding), and each operand's tile shape and fragment
    layout over its cached buffer's (row, col)."""

    names: dict
    tile_k: int
    vec: int
    in_bytes: int
    a_tile: tuple
    b_tile: tuple
    a_layout: Callable
    b_layout: Callable


def operand_tiles(dtype: str, trans_b: bool) -> OperandTiles:
    """fp16 / bf16 (registers the intrinsics); int8's are :func:`.tensorcore_int8.operand_tiles`."""
    register_intrinsics()
    return OperandTiles(intrin_names(dtype, trans_b, sync=True), TILE, VEC, 2, (TILE, TILE), (TILE, TILE),
                        fragment_layout, fragment_layout)


def weight_is_transposed(sch: s_tir.Schedule, block) -> bool:
    """True for an (N, K) weight: its first index is not the reduction variable."""
    stmt = sch.get(block)
    k_var = stmt.iter_vars[-1].var
    first = stmt.reads[1].region[0].min
    return not (isinstance(first, tvm.tirx.Var) and first.same_as(k_var))


def smem_bytes(bm: int, bn: int, kc: int, in_bytes: int = 2) -> int:
    """Shared memory of one block: x and W tiles, rows padded by 16 bytes, plus the 32-bit output tile."""
    pad = 16 // in_bytes
    return (bm * (kc + pad) + kc * (bn + pad)) * in_bytes + bm * bn * 4


def mma_defaults(M: int, N: int, K: int, lim: dict, tile_k: int = TILE, in_bytes: int = 2, act: str = "none") -> dict:
    """2×2 warps; per warp 1×2 tiles of 16×16 (a 32×64 block tile) where the shape allows, kc = 32.

    At M=128 this gives 4 row tiles × N/64 column tiles: 24-48 blocks of 128 threads for BERT/MiniLM widths,
    and 16 fp32 accumulators per thread, far from the register limit. A narrower N falls back to fewer
    tiles. int8 (``tile_k`` 32, one byte per element): the same tiles with kc = 64."""
    mt, nt, kt = M // TILE, N // TILE, K // tile_k
    max_warps = max(1, lim["threads"] // lim["warp"])
    wm = largest_divisor(mt, 2)
    wn = largest_divisor(nt, max(1, min(2, max_warps // wm)))
    fm = 1
    fn = largest_divisor(nt // wn, 2)
    ki = largest_divisor(kt, 2)
    # never the case at these tile sizes, but the limit is the target's: shrink K first, then N
    while smem_bytes(wm * fm * TILE, wn * fn * TILE, ki * tile_k, in_bytes) > lim["smem"] and (ki > 1 or fn > 1):
        if ki > 1:
            ki = largest_divisor(kt, ki - 1)
        else:
            fn = largest_divisor(nt // wn, fn - 1)
    # The unroll that keeps every fragment in registers. fp16/bf16 without an activation: 64 steps. At 16, TVM
    # leaves the K loop rolled and nvcc unrolls a short one (12 steps at K = 384) itself: on sm_80 ptxas then kept an
    # 8-byte stack frame with 16 bytes of spills in MiniLM's projections (``#pragma unroll 1`` on that loop removes
    # them too). With an activation: 16, since at 64 the GELU epilogue at K = N = 384 spills 72 bytes on sm_90.
    # So no MiniLM, BERT-base or LLaMA-7B shape spills on sm_80 or sm_90 (tests/cuda/test_cuda_resources.py,
    # test_cuda_compile.py). int8: none. At 16 steps ptxas keeps the same stack frame in MiniLM's QKV projection
    # on sm_90; with none, no shape spills (tests/cuda/test_cuda_precision.py).
    unroll = 0 if in_bytes == 1 else 2 if act == "none" else 1
    return {"i": [mt // (wm * fm), wm, fm], "j": [nt // (wn * fn), wn, fn], "k": [kt // ki, ki], "unroll": unroll}


def _decision(knobs: dict, key: str, default):
    v = knobs.get(key)
    if v is None:
        return default
    return [int(x) for x in v] if isinstance(default, list) else int(v)


def dense_mma(sch: s_tir.Schedule, block, target: tvm.target.Target, knobs: Optional[dict] = None,
              tiles: Optional[OperandTiles] = None) -> None:
    """The tensor-core template; ``tiles``: the input dtype's mma (default: fp16 / bf16 from the block)."""
    knobs = knobs or {}
    lim = TargetInfo.of(target).limits()
    if tiles is None:
        tiles = operand_tiles(str(sch.get(block).reads[0].source.dtype), weight_is_transposed(sch, block))
    names = tiles.names
    epilogue = sch.get_consumers(block)[0]

    flatten_write_rows(sch, block)
    i, j, k = flatten_block_rows(sch, block, extra=2)
    M, N, K = (int(sch.get(lp).extent) for lp in (i, j, k))
    d = mma_defaults(M, N, K, lim, tiles.tile_k, tiles.in_bytes, op_params(sch).get("act", "none"))

    i0, i_tc = sch.split(i, [None, TILE])
    j0, j_tc = sch.split(j, [None, TILE])
    k0, k_tc = sch.split(k, [None, tiles.tile_k])
    sch.reorder(i0, j0, k0, i_tc, j_tc, k_tc)
    outer = sch.blockize(i_tc)  # ``block`` is now the 16×16×tile_k tile the mma intrinsic replaces

    ti = sch.sample_perfect_tile(i0, n=3, max_innermost_factor=4, decision=_decision(knobs, "i", d["i"]))
    tj = sch.sample_perfect_tile(j0, n=3, max_innermost_factor=4, decision=_decision(knobs, "j", d["j"]))
    tk = sch.sample_perfect_tile(k0, n=2, max_innermost_factor=4, decision=_decision(knobs, "k", d["k"]))
    bm, wm, fm = sch.split(i0, ti)
    bn, wn, fn = sch.split(j0, tj)
    ko, ki = sch.split(k0, tk)
    sch.reorder(bm, bn, wm, wn, ko, ki, fm, fn)
    bx = sch.fuse(bm, bn)
    ty = sch.fuse(wm, wn)
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")

    def spread(loop, vec):
        """Split ``loop`` over all warps × lanes with ``vec``-wide vectors. The warp count is the product of
        two sampled extents; a product of random variables cannot be recorded in a trace, so split by both
        and fuse the two loops instead."""
        _, f_wm, f_wn, f_x, f_v = sch.split(loop, [None, ti[1], tj[1], WARP, vec])
        sch.bind(sch.fuse(f_wm, f_wn), "threadIdx.y")
        sch.bind(f_x, "threadIdx.x")
        sch.vectorize(f_v)

    # operands: global -> shared (cooperative, 16-byte vectors) -> register fragments
    for idx in (0, 1):
        shared = sch.cache_read(outer, idx, "shared")
        sch.compute_at(shared, ko, preserve_unit_loops=True)
        spread(sch.fuse(*sch.get_loops(shared)[-len(sch.get(shared).writes[0].region):]), tiles.vec)
        sch.storage_align(shared, 0, axis=-2, factor=32, offset=16 // tiles.in_bytes)  # 16 bytes

    frags = []
    for idx, (tr, tc) in ((0, tiles.a_tile), (1, tiles.b_tile)):
        frag = sch.cache_read(outer, idx, FRAG_SCOPE)
        sch.compute_at(frag, ki, preserve_unit_loops=True)
        r, c = sch.get_loops(frag)[-2:]
        r0, r1 = sch.split(r, [None, tr])
        c0, c1 = sch.split(c, [None, tc])
        sch.reorder(r0, c0, r1, c1)
        frags.append((frag, r1))

    acc = sch.cache_write(outer, 0, FRAG_SCOPE)
    sch.reverse_compute_at(acc, ty, preserve_unit_loops=True)
    r, c = sch.get_loops(acc)[-2:]
    r0, r1 = sch.split(r, [None, TILE])
    c0, c1 = sch.split(c, [None, TILE])
    sch.reorder(r0, c0, r1, c1)

    # fp32 tile in shared memory; the epilogue reads it with the whole block, coalesced and vectorised
    sch.set_scope(acc, 0, "shared")
    flatten_block_rows(sch, epilogue, extra=1)
    sch.reverse_compute_at(epilogue, bx, preserve_unit_loops=True)
    inline_consumers(sch, epilogue)
    spread(sch.fuse(*sch.get_loops(epilogue)[-2:]), 4)

    def to_fragments(blk, rw, tile, layout):
        tr, tc = tile
        sch.transform_layout(blk, (rw, 0), lambda *ax: (*ax[:-2], ax[-2] // tr, ax[-1] // tc,
                                                        *layout(ax[-2] % tr, ax[-1] % tc)))

    to_fragments(frags[0][0], "write", tiles.a_tile, tiles.a_layout)
    to_fragments(frags[1][0], "write", tiles.b_tile, tiles.b_layout)
    to_fragments(acc, "read", (TILE, TILE), fragment_layout)

    init = sch.decompose_reduction(outer, ko)
    sch.tensorize(frags[0][1], names["load_a"])
    sch.tensorize(frags[1][1], names["load_b"])
    sch.tensorize(sch.get_loops(block)[-3], names["compute"])
    sch.tensorize(init, names["init"])
    sch.tensorize(r1, names["store"])

    u = sch.sample_categorical(list(UNROLL_STEPS), [1.0 / len(UNROLL_STEPS)] * len(UNROLL_STEPS),
                               decision=knobs.get("unroll", d["unroll"]))
    sch.annotate(bx, "pragma_auto_unroll_max_step", u)
    sch.annotate(bx, "pragma_unroll_explicit", 1)
