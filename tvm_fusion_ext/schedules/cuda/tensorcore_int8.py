"""Tensor-core intrinsics for ``fused_dense_int8`` on sm_80/sm_90: mma.sync m16n8k32 ``.u8.s8`` → s32.

The activations are uint8 (quantised per row with a zero point) and the weights int8 (symmetric), the product
PTX's mma takes as ``.u8.s8`` with exact int32 accumulation; the template is :func:`.tensorcore.dense_mma`, the
fp16/bf16 one, with these operand tiles: 16 × 32 bytes of x, 16 output channels × 32 bytes of the weight.

The weight is (N, K) (the operator's ``transpose_b``): mma wants B column-major, and ldmatrix's ``.trans``
moves 16-bit elements, so it cannot transpose bytes. An (N, K) tile is B column-major already, and
``ldmatrix.x4 .b16`` without ``.trans`` loads it as it loads x: each 8 × 16-byte matrix gives every lane the
4 consecutive bytes of one row that m16n8k32 wants in one register. TVM's own int8 intrinsics
(``mma_ldmatrix_i8_*``, ``mma_i8i8i32``) are s8 × s8 only, on "warp" fragments (see :mod:`.tensorcore` for why
ours live in "local" ones).

Fragment of a 16 × 32 byte tile, per lane 16 values (4 registers of 4 bytes), as ldmatrix.x4 leaves them and
m16n8k32 reads them:

* x (rows i, bytes k): register ``2·(k // 16) + i // 8`` (a0: rows 0-7 of bytes 0-15, a1: rows 8-15, a2 / a3:
  bytes 16-31), lane ``4·(i % 8) + (k % 16) // 4``, byte ``k % 4``;
* W (channels n, bytes k): register ``2·(n // 8) + k // 16`` (b0, b1: channels 0-7, the first mma's B; b2, b3:
  channels 8-15, the second's), same lane and byte.

The accumulator is the fp16 path's: the m16n8 C fragment of 32-bit values, in int32.
"""

from __future__ import annotations

from tvm.runtime import convert
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T
from tvm.tirx import Cast

from .tensorcore import OperandTiles, _fill, _store_shared, fragment_layout

WARP = 32
TILE = 16    # rows (m) and output channels (n) per tensorized tile
TILE_K = 32  # bytes of K per tile (one m16n8k32)
LOCAL = TILE * TILE_K // WARP  # bytes per lane of an operand fragment
ACC_LOCAL = TILE * TILE // WARP  # int32 accumulators per lane of a 16 × 16 tile
A_DTYPE, B_DTYPE, ACC_DTYPE = "uint8", "int8", "int32"
_PTX = {"uint8": "uint8", "int8": "int8", "int32": "int32"}


def layout_a(i, k):
    """(row, byte) of a 16 × 32 x tile -> (lane, value) of its m16n8k32 A fragment."""
    return 4 * (i % 8) + (k % 16) // 4, 4 * (2 * (k // 16) + i // 8) + k % 4


def layout_b(n, k):
    """(channel, byte) of a 16 × 32 (N, K) weight tile -> (lane, value) of two m16n8k32 B fragments."""
    return 4 * (n % 8) + (k % 16) // 4, 4 * (2 * (n // 8) + k // 16) + k % 4


def ldmatrix_row(operand: str, tx, half=WARP // 2):
    """(row, byte) of the tile row lane ``tx`` addresses for ldmatrix.x4 (lanes 8·j…8·j+7: matrix j's rows, which
    lands in register j). x: lanes 0-15 rows 0-15 at byte 0, lanes 16-31 the same rows at byte 16; W: lanes
    0-7 / 8-15 / 16-23 / 24-31 channels 0-7 / 0-7 (+16 bytes) / 8-15 / 8-15 (+16 bytes)."""
    if operand == "a":
        return tx % half, 16 * (tx // half)
    return 8 * (tx // half) + tx % 8, 16 * ((tx % half) // 8)


def _ldmatrix(dtype: str, operand: str):
    """shared 16 × 32 bytes -> fragment, ldmatrix.x4 .b16 without .trans, with the block barriers of
    :func:`.tensorcore._ldmatrix` (``sync``) around it."""
    layout = layout_a if operand == "a" else layout_b
    half = convert(WARP // 2)
    row_col = lambda tx: ldmatrix_row(operand, tx, half)  # noqa: E731

    @T.prim_func(s_tir=True)
    def desc(warp_h: T.handle, shared_h: T.handle) -> None:
        shared = T.match_buffer(shared_h, (TILE, TILE_K), dtype, align=64, offset_factor=TILE_K, scope="shared")
        warp = T.match_buffer(warp_h, (WARP, LOCAL), dtype, align=64, offset_factor=TILE_K, scope="local")
        with T.sblock("root"):
            T.reads(shared[0:TILE, 0:TILE_K])
            T.writes(warp[0:WARP, 0:LOCAL])
            for a0, a1 in T.grid(TILE, TILE_K):
                with T.sblock("shared_warp"):
                    v0, v1 = T.axis.remap("SS", [a0, a1])
                    T.reads(shared[v0, v1])
                    lane, value = T.meta_var(layout(v0, v1))
                    T.writes(warp[lane, value])
                    warp[lane, value] = shared[v0, v1]

    @T.prim_func(s_tir=True)
    def impl(warp_h: T.handle, shared_h: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        shared = T.match_buffer(shared_h, (TILE, TILE_K), dtype, align=64, offset_factor=TILE_K, scope="shared",
                                strides=[s0, s1])
        warp = T.match_buffer(warp_h, (WARP, LOCAL), dtype, align=64, offset_factor=TILE_K, scope="local")
        with T.sblock("root"):
            T.reads(shared[0:TILE, 0:TILE_K])
            T.writes(warp[0:WARP, 0:LOCAL])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                row, col = T.meta_var(row_col(tx))
                T.evaluate(T.tvm_storage_sync("shared"))
                T.evaluate(T.ptx_legacy.ldmatrix(False, 4, ".b16", warp.data, warp.elem_offset,
                                                 T.address_of(shared[row, col]), 0, dtype=dtype))
                T.evaluate(T.tvm_storage_sync("shared"))

    return desc, impl


def _mma():
    """C[16 × 16, int32] += A[16 × 32, u8] · B[16 × 32, s8]ᵀ as two m16n8k32 mma.sync (channels 0-7, 8-15)."""
    i32 = lambda v: Cast(ACC_DTYPE, v)  # noqa: E731

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (WARP, LOCAL), A_DTYPE, align=64, offset_factor=TILE_K, scope="local")
        B = T.match_buffer(b, (WARP, LOCAL), B_DTYPE, align=64, offset_factor=TILE_K, scope="local")
        C = T.match_buffer(c, (WARP, ACC_LOCAL), ACC_DTYPE, align=64, offset_factor=TILE, scope="local")
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:ACC_LOCAL], A[0:WARP, 0:LOCAL], B[0:WARP, 0:LOCAL])
            T.writes(C[0:WARP, 0:ACC_LOCAL])
            for i, j, k in T.grid(TILE, TILE, TILE_K):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    lc, xc = T.meta_var(fragment_layout(vi, vj))
                    la, xa = T.meta_var(layout_a(vi, vk))
                    lb, xb = T.meta_var(layout_b(vj, vk))
                    T.reads(C[lc, xc], A[la, xa], B[lb, xb])
                    T.writes(C[lc, xc])
                    C[lc, xc] = C[lc, xc] + i32(A[la, xa]) * i32(B[lb, xb])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (WARP, LOCAL), A_DTYPE, align=64, offset_factor=TILE_K, scope="local")
        B = T.match_buffer(b, (WARP, LOCAL), B_DTYPE, align=64, offset_factor=TILE_K, scope="local")
        C = T.match_buffer(c, (WARP, ACC_LOCAL), ACC_DTYPE, align=64, offset_factor=TILE, scope="local")
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:ACC_LOCAL], A[0:WARP, 0:LOCAL], B[0:WARP, 0:LOCAL])
            T.writes(C[0:WARP, 0:ACC_LOCAL])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                T.evaluate(T.ptx_legacy.mma("m16n8k32", "row", "col", _PTX[A_DTYPE], _PTX[B_DTYPE], _PTX[ACC_DTYPE],
                                            A.data, A.elem_offset, B.data, B.elem_offset,
                                            C.data, C.elem_offset, False, dtype=ACC_DTYPE))
                T.evaluate(T.ptx_legacy.mma("m16n8k32", "row", "col", _PTX[A_DTYPE], _PTX[B_DTYPE], _PTX[ACC_DTYPE],
                                            A.data, A.elem_offset, B.data, B.elem_offset + LOCAL // 2,
                                            C.data, C.elem_offset + ACC_LOCAL // 2, False, dtype=ACC_DTYPE))

    return desc, impl


NAMES = {"load_a": "tfx_ldmatrix_u8_a_sync", "load_b": "tfx_ldmatrix_s8_b_trans_sync",
         "compute": "tfx_mma_u8s8s32_trans_b", "init": "tfx_mma_fill_s32", "store": "tfx_mma_store_s32_shared"}

_REGISTERED = False


def register_intrinsics() -> None:
    """Register the int8 intrinsics (once, on first use: TVMScript parsing costs a second)."""
    global _REGISTERED  # noqa: PLW0603
    if _REGISTERED:
        return
    TensorIntrin.register(NAMES["load_a"], *_ldmatrix(A_DTYPE, "a"), override=True)
    TensorIntrin.register(NAMES["load_b"], *_ldmatrix(B_DTYPE, "b"), override=True)
    TensorIntrin.register(NAMES["compute"], *_mma(), override=True)
    TensorIntrin.register(NAMES["init"], *_fill(ACC_DTYPE), override=True)
    TensorIntrin.register(NAMES["store"], *_store_shared(ACC_DTYPE), override=True)
    _REGISTERED = True


def supports(M: int, N: int, K: int, trans_b: bool) -> bool:
    """Whole 16 × 16 × 32 tiles, and the weight (N, K)."""
    return trans_b and M % TILE == 0 and N % TILE == 0 and K % TILE_K == 0


def operand_tiles() -> OperandTiles:
    """The int8 operands for :func:`.tensorcore.dense_mma` (registers the intrinsics): 16-byte accesses of
    bytes, x and W tiles of 16 × 32."""
    register_intrinsics()
    return OperandTiles(NAMES, TILE_K, 16, 1, (TILE, TILE_K), (TILE, TILE_K), layout_a, layout_b)
