"""CPU fallback schedule for every PrimFunc no template and no tuning record covers.

* A kernel whose main block is a matmul (what FuseOps makes of a matmul SemanticFusion did not claim, with
  its elementwise epilogue) gets the ``tfx.dense`` register-blocked template with default knobs: a generic
  parallel loop would leave it 50-100x slower than the dense template.
* Everything else (reshapes, transposes, softmax, gathers, elementwise leftovers): inline what can be
  inlined (nothing in a kernel holding an opaque extern block: its accesses are undeclared), then per remaining
  block fuse the spatial loops into one parallel loop and split off an exact vector-width inner loop (spatial
  blocks), or keep the reduction loops serial inside it (reduction blocks). A spatial block that reads an input
  transposed is tiled instead (:func:`_transposed_axis`).
  Kernels too small to pay for a thread-pool launch stay on one thread but are still vectorised.

A dlight rule, so it composes with ``ApplyDefaultSchedule``. It never raises: a step that fails is skipped,
and a function it cannot schedule at all is returned unscheduled (``None``), which TVM still compiles.
"""

from __future__ import annotations

from typing import List, Optional

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule

from ...targets import TargetInfo
from ...tir_nodes import collect
from ..rule import root_blocks
from .dense import dense_cpu

#: Iterations below which a kernel runs on the calling thread (a pool launch costs a few microseconds).
MIN_PARALLEL_WORK = 4096
#: Smallest spatial / reduction extent for which a matmul is worth the register-blocked template.
MIN_MATMUL_EXTENT = 8

_DATA_PAR, _COMM_REDUCE = 0, 2


def _const_extent(sch: s_tir.Schedule, loop) -> Optional[int]:
    extent = sch.get(loop).extent
    return int(extent) if isinstance(extent, tirx.IntImm) else None


def _matmul_block(sch: s_tir.Schedule):
    """The root block computing ``sum_k A[..., k] * B[..k.., j]`` with loops (*spatial, j, k), if any."""
    for block in root_blocks(sch):
        b = sch.get(block)
        kinds = [int(iv.iter_type) for iv in b.iter_vars]
        loops = sch.get_loops(block)
        if (len(kinds) < 2 or kinds[-1] != _COMM_REDUCE or any(k != _DATA_PAR for k in kinds[:-1])
                or len(loops) != len(kinds) or len(b.reads) != 2
                or not isinstance(b.body, tirx.BufferStore) or not isinstance(b.body.value, tirx.Add)
                or not isinstance(b.body.value.b, tirx.Mul)):
            continue
        extents = [_const_extent(sch, lp) for lp in loops]
        if None in extents or extents[-1] < MIN_MATMUL_EXTENT or extents[-2] < MIN_MATMUL_EXTENT:
            continue
        return block
    return None


def _already_parallel(sch: s_tir.Schedule, block) -> bool:
    return any(sch.get(lp).kind == tirx.ForKind.PARALLEL for lp in sch.get_loops(block))


def _loop_kinds(sch: s_tir.Schedule, block) -> Optional[List[str]]:
    """'S'/'R' per loop when each loop drives exactly one block iterator (trivial bindings), else None."""
    b = sch.get(block)
    loops = sch.get_loops(block)
    if len(loops) != len(b.iter_vars):
        return None
    kinds = []
    for iv in b.iter_vars:
        if int(iv.iter_type) == _DATA_PAR:
            kinds.append("S")
        elif int(iv.iter_type) == _COMM_REDUCE:
            kinds.append("R")
        else:
            return None
    return kinds


def _split_at_last_symbolic(sch: s_tir.Schedule, s_loops) -> tuple:
    """(loops up to the last one of symbolic extent, the static loops after it)."""
    last = max((n for n, lp in enumerate(s_loops) if _const_extent(sch, lp) is None), default=-1)
    return s_loops[:last + 1], s_loops[last + 1:]


def _has_opaque_block(sch: s_tir.Schedule) -> bool:
    """Whether a root block declares no reads and no writes although it computes something: TE extern ops (sort,
    NMS, cumsum) lower to such blocks. Their real accesses are invisible to the schedule's dependence analysis, so
    ``compute_inline`` may inline a buffer such a block reads or even writes in place (NonMaxSuppression's
    ``T_gather``: the build then failed with "Buffer T_gather is used before its definition")."""
    for block in root_blocks(sch):
        b = sch.get(block)
        if not b.reads and not b.writes and not isinstance(b.body, tirx.Evaluate):
            return True
    return False


#: rows of the input a transposing kernel reads per tile: one 64-byte line of floats each, all kept in L1
TRANSPOSE_TILE = 16


def _vars_of(expr) -> set:
    return {v.name for v in tvm.tirx.analysis.undefined_vars(expr)}


def _transposed_axis(sch: s_tir.Schedule, block) -> Optional[int]:
    """The loop a transposing read walks contiguously, when it is not the innermost one, else None.

    A spatial block whose innermost loop writes contiguously but reads some input with a stride (a transpose:
    wav2vec2's ``[1, 3199, 512] -> [1, 512, 3199]`` between its convolutions) visits a new input line per element;
    once the innermost extent's lines no longer fit in L1 every vector load misses (1.7 GB/s against 17-20 for
    the same kernel over 56-wide rows). Such a read is one whose last index is a function of one loop other than
    the innermost, while the innermost loop moves it along another dim."""
    b = sch.get(block)
    names = [iv.var.name for iv in b.iter_vars]
    if len(names) < 2 or len(b.writes) != 1:
        return None
    last = names[-1]
    write_index = b.writes[0].region[-1].min
    if _vars_of(write_index) != {last}:
        return None
    for read in b.reads:
        region = read.region
        if len(region) < 2:
            continue
        inner = _vars_of(region[-1].min)
        if len(inner) != 1 or last in inner or not any(last in _vars_of(r.min) for r in region[:-1]):
            continue
        axis = names.index(next(iter(inner))) if next(iter(inner)) in names else None
        if axis is not None:
            return axis
    return None


#: math intrinsics LLVM codegen can lower for scalars only ("unknown intrinsic tirx.cosh" on a vector)
SCALAR_ONLY_MATH = frozenset({"tirx.cosh", "tirx.sinh"})


def _calls_scalar_only_math(sch: s_tir.Schedule, block) -> bool:
    return any(isinstance(call.op, tvm.ir.Op) and call.op.name in SCALAR_ONLY_MATH
               for call in collect(sch.get(block).body, tvm.ir.expr.Call))


class Fallback(CPUScheduleRule):
    """Dense template for leftover matmuls; parallel outer + vectorised inner loop for everything else."""

    def apply(self, func: tirx.PrimFunc, target: tvm.target.Target, _tunable: bool) -> Optional[s_tir.Schedule]:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            return self._schedule(func, target)
        except Exception:  # noqa: BLE001  (a fallback must never break a build: leave the function as it is)
            return None

    def _schedule(self, func: tirx.PrimFunc, target: tvm.target.Target) -> Optional[s_tir.Schedule]:
        sch = self._try_matmul(func, target)
        if sch is None:
            sch = s_tir.Schedule(func)
            infos = normalize_prim_func(sch)
            if infos is None:
                return None
            if not _has_opaque_block(sch):
                dl.try_inline(sch, infos)
        lanes = TargetInfo.of(target).lanes()
        reductions = []
        for block in root_blocks(sch):
            if _already_parallel(sch, block):
                continue
            try:
                r_loop = self._parallel_vectorise(sch, block, lanes)
            except s_tir.ScheduleError:
                continue
            if r_loop is not None:
                reductions.append((block, r_loop))
        for block, r_loop in reductions:
            try:
                sch.decompose_reduction(block, r_loop)
            except s_tir.ScheduleError:
                pass
        return sch

    @staticmethod
    def _try_matmul(func: tirx.PrimFunc, target: tvm.target.Target) -> Optional[s_tir.Schedule]:
        sch = s_tir.Schedule(func)
        block = _matmul_block(sch)
        if block is None:
            return None
        try:
            dense_cpu(sch, block, target)
        except Exception:  # noqa: BLE001  (not the shape the template expects after all)
            return None
        return sch

    @staticmethod
    def _parallel_vectorise(sch: s_tir.Schedule, block, lanes: int):
        """Schedule one root block; returns its first reduction loop (to decompose later) or None."""
        loops = sch.get_loops(block)
        kinds = _loop_kinds(sch, block)
        if not loops or kinds is None:
            return None
        s_loops = [lp for lp, k in zip(loops, kinds) if k == "S"]
        r_loops = [lp for lp, k in zip(loops, kinds) if k == "R"]
        if not s_loops:
            return None
        if r_loops:
            sch.reorder(*s_loops, *r_loops)
        work = 1
        for lp in loops:
            e = _const_extent(sch, lp)
            work *= e if e is not None else MIN_PARALLEL_WORK
        if not r_loops and len(s_loops) == len(loops) and Fallback._tile_transpose(sch, block, loops, lanes, work):
            return None
        lead, tail = _split_at_last_symbolic(sch, s_loops) if not r_loops else (s_loops, [])
        if lead and tail:
            # Symbolic extents: a loop fused across them recovers each index with 64-bit divisions by run-time
            # values, per element (3 per element of an embedding gather: ~100x its static cost). The parallel
            # loop takes the symbolic loops (one division per row), the static inner loops form the vector loop.
            outer = sch.fuse(*lead) if len(lead) > 1 else lead[0]
            inner = sch.fuse(*tail) if len(tail) > 1 else tail[0]
            extent = _const_extent(sch, inner)
            if _calls_scalar_only_math(sch, block):
                pass
            elif extent % lanes == 0 and extent > lanes:
                sch.vectorize(sch.split(inner, [None, lanes])[1])
            elif 1 < extent <= lanes:  # an empty loop (a zero-width slice: Phi-3's rotary pass-through) stays
                sch.vectorize(inner)
            sch.parallel(outer)
            return None
        fused = sch.fuse(*s_loops) if len(s_loops) > 1 else s_loops[0]
        extent = _const_extent(sch, fused)
        outer = fused
        if not r_loops and extent is not None and not _calls_scalar_only_math(sch, block):
            if extent % lanes == 0 and extent > lanes:
                outer, inner = sch.split(fused, [None, lanes])
                sch.vectorize(inner)
            elif 1 < extent <= lanes:  # LLVM codegen refuses to vectorize an empty loop
                sch.vectorize(fused)
                outer = None
        if outer is not None and work >= MIN_PARALLEL_WORK and (extent is None or extent > 1):
            sch.parallel(outer)
        return r_loops[0] if r_loops else None

    @staticmethod
    def _tile_transpose(sch: s_tir.Schedule, block, loops, lanes: int, work: int) -> bool:
        """Tile a transposing block (:func:`_transposed_axis`) so that each tile reads ``TRANSPOSE_TILE`` input
        lines, reused from L1 by every vector of the tile; True when it did."""
        axis = _transposed_axis(sch, block)
        if axis is None or _calls_scalar_only_math(sch, block):
            return False
        inner_extent, axis_extent = _const_extent(sch, loops[-1]), _const_extent(sch, loops[axis])
        if axis_extent is None or axis_extent < TRANSPOSE_TILE or (inner_extent is not None and
                                                                   inner_extent < TRANSPOSE_TILE):
            return False
        if inner_extent is None and axis_extent % lanes:
            return False  # a symbolic write axis is tiled with a predicate: the vector must run along the read
        # the vector runs along whichever of the two extents whole vectors divide (the write's axis first);
        # the other axis is tiled with a tail predicate, which only a serial loop may carry
        if inner_extent is not None and inner_extent % lanes == 0:
            a_tile, b_tile, vector = TRANSPOSE_TILE, lanes, "b"
        elif axis_extent % lanes == 0:
            a_tile, b_tile, vector = lanes, TRANSPOSE_TILE, "a"
        else:
            a_tile, b_tile, vector = TRANSPOSE_TILE, TRANSPOSE_TILE, None
        a_out, a_in = sch.split(loops[axis], [None, a_tile])
        b_out, b_in = sch.split(loops[-1], [None, b_tile])
        outer = [*loops[:axis], a_out, *loops[axis + 1:-1], b_out]
        if vector == "a":
            sch.reorder(*outer, b_in, a_in)
            sch.vectorize(a_in)
        else:
            sch.reorder(*outer, a_in, b_in)
            if vector == "b":
                sch.vectorize(b_in)
        if work >= MIN_PARALLEL_WORK:
            sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
        return True
