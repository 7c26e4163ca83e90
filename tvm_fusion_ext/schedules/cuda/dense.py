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

from dataclasses import dataclass
from typing import List, Optional, Sequence

import tvm
from tvm import s_tir

from ...targets import TargetInfo
from ..common import flatten_block_rows, flatten_write_rows, inline_consumers, largest_divisor
from ..rule import Knobs, TemplateRule, symbolic_extent_reason
from . import tensorcore

VECTOR_WIDTHS = (1, 2, 4)
UNROLL_STEPS = (0, 16, 64, 512)
#: Registers a thread may hold as accumulators: 4x4 keeps an fp32 kernel near 64 registers, well inside
#: the 255-register limit with the two operand fragments, so nothing spills.
THREAD_TILE = 4
#: Threads per block aimed at: 128 leaves room for several resident blocks per SM at these tile sizes.
TARGET_THREADS = 128
KC = 16


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


def dense_cuda(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, target: tvm.target.Target,
               knobs: Optional[dict] = None) -> None:
    if tensorcore.supports(*_gemm_shape(sch, block), _input_dtype(sch, block)):
        tensorcore.dense_mma(sch, block, target, knobs)
    else:
        dense_simt(sch, block, target, knobs)


def dense_simt(sch: s_tir.Schedule, block, target: tvm.target.Target, knobs: Optional[dict] = None) -> None:
    knobs = knobs or {}
    lim = TargetInfo.of(target).limits()
    flatten_write_rows(sch, block)
    i, j, k = flatten_block_rows(sch, block, extra=2)
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


@dataclass(frozen=True)
class DenseCudaKnobs(Knobs):
    i: Optional[Sequence[int]] = None       # SIMT [by, ty, yi]; tensor cores [bm, wm, fm] in 16-row tiles
    j: Optional[Sequence[int]] = None       # SIMT [bx, tx, xi]; tensor cores [bn, wn, fn] in 16-column tiles
    k: Optional[Sequence[int]] = None       # [ko, kc] (tensor cores: in 16-element tiles)
    vec: Optional[int] = None               # SIMT only: index into VECTOR_WIDTHS
    unroll: Optional[int] = None            # index into UNROLL_STEPS


class DenseCUDA(TemplateRule):
    """``fused_dense`` on CUDA: mma.sync tensor cores for fp16/bf16 in 16-multiples, a SIMT GEMM otherwise."""

    block_rule = "tfx.dense"
    family = "cuda"
    Knobs = DenseCudaKnobs

    def decline(self, sch, block, target):
        return symbolic_extent_reason(sch)

    def schedule(self, sch, block, target, knobs=None):
        dense_cuda(sch, block, target, knobs)
