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
The path follows dtype and shape, static properties of the PrimFunc, never a knob.

Knobs (``sample_perfect_tile`` decisions unless said otherwise), fp32:
    ``i``: [by, ty, yi]   ``j``: [bx, tx, xi]   ``k``: [ko, kc]
    ``vec``: index into :data:`VECTOR_WIDTHS`   ``unroll``: index into :data:`UNROLL_STEPS`
Defaults are chosen per shape from the target's limits (threads and shared memory per block).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import tvm
from tvm import s_tir
from tvm.tirx import IndexMap

from ..common import inline_consumers, largest_divisor
from ..registry import register_template

VECTOR_WIDTHS = (1, 2, 4)
UNROLL_STEPS = (0, 16, 64, 512)
#: Registers a thread may hold as accumulators: 4x4 keeps an fp32 kernel near 64 registers, well inside
#: the 255-register limit with the two operand fragments, so nothing spills.
THREAD_TILE = 4
#: Threads per block aimed at: 128 leaves room for several resident blocks per SM at these tile sizes.
TARGET_THREADS = 128
KC = 16


def limits(target: tvm.target.Target) -> dict:
    """Per-block limits of a CUDA target (resolve_target fills them in)."""
    get = lambda k, d: int(target.attrs[k]) if target.attrs.get(k) is not None else d  # noqa: E731
    return {"threads": get("max_threads_per_block", 1024), "smem": get("max_shared_memory_per_block", 49152),
            "warp": get("thread_warp_size", 32), "registers": get("registers_per_block", 65536)}


def flatten_rows(sch: s_tir.Schedule, block, extra: int):
    """Make the block's batch axes one row axis (in its iteration space, not just its loops).

    Tiles of a fused loop are then rectangles in (row, col); with only fused loops a tile straddling two
    batch entries would have a bounding-box region that overlaps the next tile."""
    loops = sch.get_loops(block)
    batch = loops[: len(loops) - extra]
    if len(batch) == 1:
        return loops
    if not batch:
        sch.add_unit_loop(loops[0])
        return sch.get_loops(block)
    shape = [int(sch.get(lp).extent) for lp in batch]
    idx_dtype = str(sch.get(loops[-1]).extent.ty)

    def fn(*iv):
        row = iv[0]
        for d, v in zip(shape[1:], iv[1:len(shape)]):
            row = row * d + v
        return (row, *iv[len(shape):])

    sch.transform_block_layout(block, IndexMap.from_func(fn, ndim=len(shape) + extra, index_dtype=idx_dtype))
    return sch.get_loops(block)


def flatten_output(sch: s_tir.Schedule, block) -> None:
    """Give the block's (intermediate) output buffer one row axis, so a thread's or block's tile of it is a
    rectangle: a register tile indexed through (batch, seq) bounding boxes would be addressed dynamically
    and land in local memory."""
    buf = sch.get(block).writes[0].source
    if len(buf.shape) <= 2:
        return
    shape = [int(d) for d in buf.shape[:-1]]

    def fn(*iv):
        row = iv[0]
        for d, v in zip(shape[1:], iv[1:-1]):
            row = row * d + v
        return (row, iv[-1])

    sch.transform_layout(block, ("write", 0), fn)


def _decision(given: Optional[Sequence[int]], default: List[int]) -> List[int]:
    return [int(v) for v in given] if given is not None else default


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


@register_template("tfx.dense", "cuda")
def dense_cuda(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, target: tvm.target.Target,
               knobs: Optional[dict] = None) -> None:
    from . import tensorcore

    if tensorcore.supports(*_gemm_shape(sch, block), _input_dtype(sch, block)):
        tensorcore.dense_mma(sch, block, target, knobs)
    else:
        dense_simt(sch, block, target, knobs)


def dense_simt(sch: s_tir.Schedule, block, target: tvm.target.Target, knobs: Optional[dict] = None) -> None:
    knobs = knobs or {}
    lim = limits(target)
    flatten_output(sch, block)
    i, j, k = flatten_rows(sch, block, extra=2)
    M, N, K = (int(sch.get(lp).extent) for lp in (i, j, k))
    d = simt_defaults(M, N, K, lim)

    ti = sch.sample_perfect_tile(i, n=3, max_innermost_factor=8, decision=_decision(knobs.get("i"), d["i"]))
    tj = sch.sample_perfect_tile(j, n=3, max_innermost_factor=8, decision=_decision(knobs.get("j"), d["j"]))
    tk = sch.sample_perfect_tile(k, n=2, max_innermost_factor=64, decision=_decision(knobs.get("k"), d["k"]))
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
    inline_consumers(sch, acc)

    vec = sch.sample_categorical(list(VECTOR_WIDTHS), [1.0 / len(VECTOR_WIDTHS)] * len(VECTOR_WIDTHS),
                                 decision=knobs.get("vec", d["vec"]))
    for idx in (0, 1):
        shared = sch.cache_read(block, idx, "shared")
        sch.compute_at(shared, ko, preserve_unit_loops=True)
        fused = sch.fuse(*sch.get_loops(shared)[-len(sch.get(shared).writes[0].region):])
        # The thread extents are random variables: reusing them keeps the cooperative fetch consistent with
        # whatever tile the search picks.
        _, fy, fx, fv = sch.split(fused, [None, ti[1], tj[1], vec])
        sch.bind(fy, "threadIdx.y")
        sch.bind(fx, "threadIdx.x")
        sch.vectorize(fv)

    sch.decompose_reduction(block, ko)
    u = sch.sample_categorical(list(UNROLL_STEPS), [1.0 / len(UNROLL_STEPS)] * len(UNROLL_STEPS),
                               decision=knobs.get("unroll", d["unroll"]))
    sch.annotate(by, "pragma_auto_unroll_max_step", u)
    sch.annotate(by, "pragma_unroll_explicit", 1)
