"""Tensor cores for ``fused_attention`` (fp16/bf16, fp32 accumulation): both matmuls of the flash loop.

Uses the mma.sync m16n8k16 intrinsics of :mod:`.tensorcore` (see there why not wmma). One thread block per
query tile of ``R = 16·W`` rows and ``W`` warps; warp ``w`` owns rows ``16w … 16w+15`` in every stage, so the
block never needs more threads than that::

    Q tile      global → shared, once per block (rotary Q: rotated on the way) [R, D]   16-bit
    for each key block of kb keys:                                        (the flash loop)
        K tile  global → shared                                           [kb, D]  16-bit
        qk      ldmatrix Q, ldmatrix K → mma → fp32 scores, shared        [R, kb]
        bmax    warp all-reduce per row                                   shared
        p16     exp(score - bmax) rounded to 16 bits, shared              [R, kb]
        bsum    warp all-reduce per row                                   shared
        V tile  global → shared                                           [kb, D]  16-bit
        bo      ldmatrix p16, ldmatrix.trans V → mma → fp32, shared       [R, D]
        online  fold (bmax, bsum, bo) into the running (max, sum, out)    registers
    out = running out / running sum

K and V are read in place when the key blocks tile the keys exactly (one kernel); otherwise, and for rotary K,
from the operator's key-blocked copies ``attn_kt`` / ``attn_vb``, which clamp the padding keys and rotate K
(two small extra kernels; K's tile is then (D, kb) and loads with ldmatrix.trans). Grouped-query heads read
K/V head ``h // group`` (the copies are per K/V head).

Nothing of S×T elements exists: the largest buffers are the R×kb score and R×D block-output tiles.
Shared tiles the intrinsics read or write are permuted so that unit axes (batch, head, key block) lead and
(rows, columns) come last: the shape the intrinsics' 2-D buffers match. Operand rows are padded by 8
elements (16 bytes) so that ldmatrix is free of bank conflicts.

Knobs: ``warps`` (perfect tile ``[tiles, W]`` of the 16-row query tiles, W ≤ 4), ``unroll``. The key block
is the operator's ``key_block``; the build path sets :data:`KEY_BLOCK` for CUDA 16-bit attention
(``AttentionCUDA.prepare_operator``).

Opt-in (:data:`OPT_IN`, environment ``TFX_CUDA_MMA_ATTENTION=1``): on an H200 (2026-11-27) this template gave
wrong outputs, because its warps' ``ldmatrix`` reads of shared tiles were not separated by barriers from the
block's cooperative stores (the defect the tensor-core dense had). Its loads now wait at block barriers as the
dense's do, which made the dense right there, but no GPU has run this template since: until
``scripts/gpu_check.py`` passes on one, 16-bit attention takes the SIMT template, which matched.

Known limits: head dims over 64 exceed 48 KiB of static shared memory at 64 keys per block and take the SIMT
template; with padded key blocks on sm_90 ptxas spills 24 bytes at two warps (S = 96, D = 64).
"""

from __future__ import annotations

import os
from typing import Optional

import tvm
from tvm import s_tir

from ..attention_blocks import kernel_stages, output_loops_bhsd
from ..common import categorical
from ...targets import TargetInfo
from .tensorcore import (
    DTYPES,
    FRAG_SCOPE,
    SMEM_PAD,
    TILE,
    UNROLL_STEPS,
    VEC,
    WARP,
    fragment_layout,
    intrin_names,
    register_intrinsics,
)

SMEM = "shared"  # static: 0.27's dynamic shared-memory merge overlapped the live Q and K tiles
#: key block the build path asks for on CUDA with 16-bit inputs (see the module docstring)
KEY_BLOCK = 64
MAX_WARPS = 4
#: environment variable that turns this template on (see the module docstring)
OPT_IN = "TFX_CUDA_MMA_ATTENTION"


def opted_in() -> bool:
    return os.environ.get(OPT_IN, "") == "1"


def smem_bytes(rows: int, head_dim: int, key_block: int, in_bytes: int = 2) -> int:
    """Shared memory of one block, an upper bound: TVM's StorageRewrite often puts p16 into the dead K tile
    and bo into the dead score tile (S = 128, D = 64, two warps: 44 KiB here, 31 KiB in ptxas)."""
    operands = (rows * (head_dim + SMEM_PAD) + head_dim * (key_block + SMEM_PAD)
                + rows * (key_block + SMEM_PAD) + key_block * (head_dim + SMEM_PAD)) * in_bytes
    return operands + (rows * key_block + rows * head_dim + 2 * rows) * 4


def supports(S: int, D: int, key_block: int, dtype: str, lim: dict) -> bool:
    return (dtype in DTYPES and S % TILE == 0 and D % TILE == 0 and key_block % (2 * TILE) == 0
            and smem_bytes(TILE, D, key_block) <= lim["smem"])


def tensor_cores_fit(sch: s_tir.Schedule, block, stages: dict, target: tvm.target.Target) -> bool:
    """Whether this kernel takes the tensor-core template: asked for (:func:`opted_in`), 16-bit operands
    (``attn_p16`` exists) and query rows, head dim and key block that tile by 16 (the key block by 32: a lane per
    key in the row reductions)."""
    if "attn_p16" not in stages or not opted_in() or not TargetInfo.of(target).tensor_cores:
        return False
    attrs = sch.mod["main"].attrs
    if attrs is not None and "cu_seqlens" in str(attrs.get("tfx.inputs", "")).split(","):
        return False  # packed (varlen): K/V blocks are per sequence, read through row_seq; the SIMT template
    _, _, s, d = output_loops_bhsd(sch, block)
    if not isinstance(sch.get(s).extent, tvm.tirx.IntImm):
        return False  # symbolic (padded) query rows: the SIMT template
    key_block = int(sch.get(stages["attn_p16"]).writes[0].source.shape[-1])
    dtype = str(sch.get(stages["attn_p16"]).writes[0].source.dtype)
    if int(sch.get(stages["attn_kt"]).writes[0].source.shape[3]) != int(sch.get(d).extent):
        return False  # V's head dim differs from Q/K's (MLA): the tiles are sized for one head dim; SIMT
    return supports(int(sch.get(s).extent), int(sch.get(d).extent), key_block, dtype, TargetInfo.of(target).limits())


def default_warps(S: int, D: int, key_block: int, lim: dict) -> int:
    """Most warps (rows per block) whose tiles fit the target's shared memory and thread limits."""
    tiles = S // TILE
    for w in range(MAX_WARPS, 0, -1):
        if tiles % w == 0 and w * WARP <= lim["threads"] and smem_bytes(w * TILE, D, key_block) <= lim["smem"]:
            return w
    return 1


def _unit_axis_first(sch, blk, kind: str, buffer_index: int = 0):
    """(b, h, rows, unit, cols) → (b, h, unit, rows, cols): the intrinsics' 2-D tiles are the last two axes."""
    sch.transform_layout(blk, (kind, buffer_index), lambda b, h, i, u, j: (b, h, u, i, j))


def _to_fragments(sch, blk, kind: str, unit_axis_first: bool = False):
    """A fragment-scope buffer in its (…, tile row, tile col, lane, value) register layout."""
    if unit_axis_first:
        sch.transform_layout(blk, (kind, 0), lambda b, h, i, u, j: (
            b, h, u, i // TILE, j // TILE, *fragment_layout(i % TILE, j % TILE)))
    else:
        sch.transform_layout(blk, (kind, 0), lambda *ax: (
            *ax[:-2], ax[-2] // TILE, ax[-1] // TILE, *fragment_layout(ax[-2] % TILE, ax[-1] % TILE)))


def _spread(sch, blk, warps, ndim: int, vector: bool = True):
    """Cooperative copy: the block's last ``ndim`` loops over all warps × lanes, 16-byte vectors."""
    fused = sch.fuse(*sch.get_loops(blk)[-ndim:])
    if not vector:
        _, ty, tx = sch.split(fused, [None, warps, WARP])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        return
    _, ty, tx, vec = sch.split(fused, [None, warps, WARP, VEC])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(vec)


def _warp_rows(sch, row_loop, col_loop):
    """rows → (warp on threadIdx.y, 16 rows serial); cols → (serial, 32 lanes on threadIdx.x)."""
    w, r = sch.split(row_loop, [None, TILE])
    sch.bind(w, "threadIdx.y")
    c, lane = sch.split(col_loop, [None, WARP])
    sch.bind(lane, "threadIdx.x")
    return r, c


def _axis_of(sch, blk, iter_var: int) -> int:
    """Which axis (1 or 2) of the block's first input, a 4-D BSHD or BHSD tensor, its ``iter_var``-th block
    variable indexes: Q's rows in ``attn_qk``, the key block in the K / V copies ``attn_kt`` / ``attn_vb``."""
    stmt = sch.get(blk)
    var = stmt.iter_vars[iter_var].var
    uses = lambda e: any(v.same_as(var) for v in tvm.tirx.analysis.undefined_vars(e))  # noqa: E731
    return next(axis for axis in (1, 2) if uses(stmt.reads[0].region[axis].min))


def attention_mma(sch: s_tir.Schedule, block, target: tvm.target.Target, knobs: Optional[dict] = None) -> None:
    register_intrinsics()
    knobs = knobs or {}
    lim = TargetInfo.of(target).limits()
    st = kernel_stages(sch, block)
    online, bo, bsum, p, bmax, qk, kt = (st[n] for n in ("attn_online", "attn_bo", "attn_bsum", "attn_p",
                                                         "attn_bmax", "attn_qk", "attn_kt"))
    p16, vb = st["attn_p16"], st["attn_vb"]
    q_bshd = _axis_of(sch, qk, 2) == 1
    sch.compute_inline(p)  # exp straight into the rounded tile: p has no other reader
    dtype = str(sch.get(p16).writes[0].source.dtype)
    key_block = int(sch.get(p16).writes[0].source.shape[-1])
    # Without padded keys, K and V are read in place (one kernel, no key-blocked copies in global memory):
    # K's tile is then (key, d), a transposed B operand. With padding the copies clamp the key index.
    k_axis, v_axis = _axis_of(sch, kt, 2), _axis_of(sch, vb, 2)
    k_buf = sch.get(kt).reads[0].source
    # rotary K is rotated while it is copied into key blocks: the copy is then the operand
    in_place = int(k_buf.shape[k_axis]) % key_block == 0 and len(sch.get(kt).reads) == 1
    if in_place:
        sch.compute_inline(kt)
        sch.compute_inline(vb)
    # every warp runs the same fragment loads (static loops, no warp-dependent branch around them), so each
    # may sit between block barriers: see tensorcore._ldmatrix's ``sync``
    qk_names = intrin_names(dtype, in_place, sync=True)
    bo_names = intrin_names(dtype, False, sync=True)  # p16·V: V's tile is (key, d) = (k, n): ldmatrix .trans

    b, h, s, d = output_loops_bhsd(sch, block)
    S, D = int(sch.get(s).extent), int(sch.get(d).extent)
    tiles = S // TILE
    w_default = default_warps(S, D, key_block, lim)
    s_t, s16 = sch.split(s, [None, TILE])
    tw = sch.sample_perfect_tile(s_t, n=2, max_innermost_factor=MAX_WARPS,
                                 decision=[int(x) for x in knobs.get("warps", [tiles // w_default, w_default])])
    s_tile, s_w = sch.split(s_t, tw)
    sch.reorder(b, h, s_tile, s_w, s16, d)
    task = sch.fuse(b, h, s_tile)
    sch.bind(task, "blockIdx.x")
    sch.bind(s_w, "threadIdx.y")
    _, lane = sch.split(d, [None, WARP])
    sch.bind(lane, "threadIdx.x")

    sch.compute_at(online, task, preserve_unit_loops=True)
    *_, ob, oh, oi, od, rb = sch.get_loops(online)
    sch.reorder(rb, ob, oh, oi, od)
    _warp_rows(sch, oi, od)
    sch.decompose_reduction(online, rb)
    for i in range(3):  # running max, sum, numerator: per-thread registers
        sch.set_scope(online, i, "local")

    for blk in (bo, bsum, p16, bmax, qk):  # consumers first
        sch.compute_at(blk, rb, preserve_unit_loops=True)
    qr = st.get("attn_qr")
    if qr is not None:  # rotary Q: rotated once per block straight into the shared A tile
        sch.compute_at(qr, task, preserve_unit_loops=True)
        sch.set_scope(qr, 0, SMEM)
        _spread(sch, qr, tw[1], 2, vector=False)  # the rotation's partner index does not vectorise
        sch.storage_align(qr, 0, axis=-2, factor=32, offset=SMEM_PAD)

    _matmul_tiles(sch, qk, qk_names, task, rb, tw[1], a_bshd=None if qr is not None else q_bshd,
                  b_bshd=in_place and k_axis == 1)
    for red in (bmax, bsum):  # row statistics: warp all-reduces, one row at a time
        *_, ri, _, rj = sch.get_loops(red)
        rows, _ = _warp_rows(sch, ri, rj)
        # not unrolled: LowerThreadAllreduce fails on copies of one all-reduce ("load_remap_")
        sch.annotate(rows, "pragma_auto_unroll_max_step", 0)
        sch.set_scope(red, 0, SMEM)
    *_, pi, _, pj = sch.get_loops(p16)
    _warp_rows(sch, pi, pj)
    sch.set_scope(p16, 0, SMEM)
    _unit_axis_first(sch, p16, "write")
    sch.storage_align(p16, 0, axis=-2, factor=32, offset=SMEM_PAD)
    _matmul_tiles(sch, bo, bo_names, task, rb, tw[1], a_bshd=None, b_bshd=in_place and v_axis == 1)

    for copy in (() if in_place else (kt, vb)):  # K and V into key blocks: their own small kernels, coalesced
        blocks, threads = sch.split(sch.fuse(*sch.get_loops(copy)), [None, 256])
        sch.bind(blocks, "blockIdx.x")
        sch.bind(threads, "threadIdx.x")

    u = categorical(sch, UNROLL_STEPS, "unroll", 512, knobs)
    sch.annotate(task, "pragma_auto_unroll_max_step", u)
    sch.annotate(task, "pragma_unroll_explicit", 1)


def _matmul_tiles(sch, blk, names, task, rb, warps, a_bshd: Optional[bool], b_bshd: bool) -> None:
    """qk = Q·Kᵀ or bo = p16·V on tensor cores, warp w on its 16 rows. Block loops under the key-block loop:
    qk (b, h, i, jb, j, d), bo (b, h, i, jb, d, j). ``a_bshd`` None: the A operand (p16) is already a shared
    tile; else A is Q, loaded once per block. ``b_bshd``: the B operand is K or V read in place as
    (B, S, H, D), so its shared tile is permuted to (B, H, S, D)."""
    *_, li, _, lc, lk = sch.get_loops(blk)
    i0, i1 = sch.split(li, [None, TILE])
    c0, c1 = sch.split(lc, [None, TILE])
    k0, k1 = sch.split(lk, [None, TILE])
    sch.reorder(i0, c0, k0, i1, c1, k1)
    outer = sch.blockize(i1)
    sch.bind(i0, "threadIdx.y")

    to_bhsd = lambda b, s, h, d: (b, h, s, d)  # noqa: E731
    if a_bshd is not None:  # Q: once per block
        a_sh = sch.cache_read(outer, 0, SMEM, consumer_blocks=[outer])
        sch.compute_at(a_sh, task, preserve_unit_loops=True)
        if a_bshd:
            sch.transform_layout(a_sh, ("write", 0), to_bhsd)
        _spread(sch, a_sh, warps, len(sch.get(a_sh).writes[0].region))
        sch.storage_align(a_sh, 0, axis=-2, factor=32, offset=SMEM_PAD)
    b_sh = sch.cache_read(outer, 1, SMEM, consumer_blocks=[outer])  # K or V: once per key block
    sch.compute_at(b_sh, rb, preserve_unit_loops=True)
    if b_bshd:
        sch.transform_layout(b_sh, ("write", 0), to_bhsd)
    _spread(sch, b_sh, warps, len(sch.get(b_sh).writes[0].region))
    sch.storage_align(b_sh, 0, axis=-2, factor=32, offset=SMEM_PAD)

    frags = []
    for idx in (0, 1):
        frag = sch.cache_read(outer, idx, FRAG_SCOPE, consumer_blocks=[outer])
        sch.compute_at(frag, k0, preserve_unit_loops=True)
        frags.append(frag)
    acc = sch.cache_write(outer, 0, FRAG_SCOPE)
    sch.reverse_compute_at(acc, c0, preserve_unit_loops=True)
    sch.set_scope(acc, 0, SMEM)
    _unit_axis_first(sch, acc, "write")
    for frag in frags:
        _to_fragments(sch, frag, "write")
    _to_fragments(sch, acc, "read", unit_axis_first=True)

    init = sch.decompose_reduction(outer, k0)
    sch.tensorize(sch.get_loops(frags[0])[-2], names["load_a"])
    sch.tensorize(sch.get_loops(frags[1])[-2], names["load_b"])
    sch.tensorize(sch.get_loops(blk)[-3], names["compute"])
    sch.tensorize(init, names["init"])
    *_, a_rows, a_unit, _ = sch.get_loops(acc)
    sch.reorder(a_unit, a_rows)  # the store's two loops must be adjacent
    sch.tensorize(a_rows, names["store"])
