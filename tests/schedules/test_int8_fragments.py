"""The int8 tensor-core fragments (schedules/cuda/tensorcore_int8.py) against the PTX ISA's own description of
``ldmatrix`` and ``mma.m16n8k32`` for 8-bit operands, emulated in numpy: what each lane loads is what the fragment
layouts say, and the two mma instructions on those fragments compute the 16 × 16 tile's u8 × s8 product. No GPU:
this checks the lane arithmetic a wrong answer on a GPU would come from."""

import numpy as np

from tvm_fusion_ext.schedules.cuda.tensorcore import fragment_layout, fragment_layout_inverse
from tvm_fusion_ext.schedules.cuda.tensorcore_int8 import LOCAL, TILE, TILE_K, WARP, layout_a, layout_b, ldmatrix_row


def _ldmatrix_x4(tile, operand):
    """PTX ldmatrix.m8n8.x4.b16: matrix j's 8 rows are addressed by lanes 8j..8j+7; lane t receives, in register j,
    row t // 4 of matrix j, 16-bit element t % 4 (bytes 4·(t % 4) … +3)."""
    frag = np.zeros((WARP, LOCAL), tile.dtype)
    for t in range(WARP):
        for j in range(4):
            row, col = ldmatrix_row(operand, 8 * j + t // 4)
            frag[t, 4 * j:4 * j + 4] = tile[row, col + 4 * (t % 4):col + 4 * (t % 4) + 4]
    return frag


def _mma_m16n8k32(a, b, c):
    """PTX mma.m16n8k32 .s32 with 8-bit A (row) and B (col): per lane t, group g = t // 4, thread in group q = t % 4:
    a_i at (row g + 8·((i // 4) % 2), col 4q + i % 4 + 16·(i // 8)); b_i at (k 4q + i % 4 + 16·(i // 4), n g);
    c_i at (row g + 8·(i // 2), col 2q + i % 2)."""
    A, B = np.zeros((16, 32), np.int64), np.zeros((32, 8), np.int64)
    for t in range(WARP):
        g, q = t // 4, t % 4
        for i in range(16):
            A[g + 8 * ((i // 4) % 2), 4 * q + i % 4 + 16 * (i // 8)] = a[t, i]
        for i in range(8):
            B[4 * q + i % 4 + 16 * (i // 4), g] = b[t, i]
    D = A @ B
    for t in range(WARP):
        g, q = t // 4, t % 4
        for i in range(4):
            c[t, i] += D[g + 8 * (i // 2), 2 * q + i % 2]


def test_ldmatrix_loads_what_the_fragment_layouts_say():
    x = np.arange(TILE * TILE_K).reshape(TILE, TILE_K)
    for operand, layout in (("a", layout_a), ("b", layout_b)):
        frag = _ldmatrix_x4(x, operand)
        for r in range(TILE):
            for k in range(TILE_K):
                lane, value = layout(r, k)
                assert frag[lane, value] == x[r, k], (operand, r, k)


def test_two_mma_on_the_loaded_fragments_give_the_tile_product():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (TILE, TILE_K))         # u8 activations, rows × K
    w = rng.integers(-127, 128, (TILE, TILE_K))      # s8 weight, (N, K)
    a, b = _ldmatrix_x4(x, "a"), _ldmatrix_x4(w, "b")
    c = np.zeros((WARP, TILE * TILE // WARP), np.int64)
    _mma_m16n8k32(a, b[:, :LOCAL // 2], c[:, :4])    # channels 0-7 (the intrinsic's first instruction)
    _mma_m16n8k32(a, b[:, LOCAL // 2:], c[:, 4:])    # channels 8-15: B + 8 bytes, C + 4 values
    got = np.zeros((TILE, TILE), np.int64)
    for lane in range(WARP):
        for value in range(8):
            got[fragment_layout_inverse(lane, value)] = c[lane, value]
    np.testing.assert_array_equal(got, x @ w.T)
    for i in range(TILE):
        for j in range(TILE):
            assert fragment_layout_inverse(*fragment_layout(i, j)) == (i, j)
