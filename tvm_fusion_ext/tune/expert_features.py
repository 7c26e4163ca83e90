"""Expert features of a scheduled kernel (Faith's idea): what a performance engineer looks at first.

MetaSchedule's ``PerStoreFeature`` describes every store statement in isolation (loop extents, touched bytes,
arithmetic counts per loop level). It does not relate the schedule to the machine: it has no notion of how
many cores share the parallel loop, how wide a vector register is, or where the caches end. These features
do, one fixed-length vector per candidate, read from the scheduled s_tir PrimFunc:

==============================  ======================================================================
``parallel_extent_log2``        log2 of the parallel iterations around the heaviest block (0: serial)
``parallel_balance``            extent / (ceil(extent / cores) * cores): 1 when every core gets the same
                                number of tasks; 1/cores for a serial kernel
``tasks_per_core_log2``         log2(parallel extent / cores): task granularity
``vector_fraction``             share of the block iterations (all blocks) under a vectorised loop
``vector_aligned_fraction``     ... under a vectorised loop whose extent is a multiple of the SIMD lanes
``vector_lanes_log2``           log2 of the vector extent of the heaviest block (0: scalar)
``vector_contiguous``           1 when the heaviest block's vector loop walks the last axis of what it
                                stores with stride 1 (a full vector store), else 0
``register_tile_ratio``         bytes touched in one step of the heaviest block's innermost reduction
                                loop (accumulator tile + operand slices) / the vector register file
``accumulator_vectors_log2``    log2 of what the heaviest block writes inside its outermost reduction loop,
                                in vector registers: the accumulator tile every reduction step updates
                                (MetaSchedule's SSRSRS tiling: i2*i3 x j2*j3), which unrolling keeps in
                                registers. Too few and the FMAs wait on each other's latency, too many and
                                they spill: on AVX2, 8 of the 16 registers is the fast tile (CUDA: the
                                whole thread block's tile, in 16-byte vectors)
``inner_accumulator_vectors_log2``  the same inside the innermost reduction loop (i3 x j3)
``task_working_set_l2_log2``    log2(bytes touched per parallel task of the heaviest block / L2)
``l1_traffic_log2``             log2(estimated bytes moved between L1 and the core / compulsory bytes)
``l2_traffic_log2``             log2(estimated bytes moved between L2 and L1 / compulsory bytes)
``unroll_log2``                 log2(1 + the largest ``pragma_auto_unroll_max_step``)
``threads_per_block_ratio``     CUDA: threads per block / the target's limit (0 on CPU)
``shared_memory_ratio``         CUDA: shared bytes per block / the target's limit
``register_ratio``              CUDA: estimated registers per thread / 255
==============================  ======================================================================

Traffic at a cache of C bytes: in every block's loop nest, the outermost loop whose footprint (distinct
bytes its iterations touch, every buffer region the block reads or writes) fits in C is loaded once per
iteration of the loops around it; the sum over blocks, divided by the bytes the kernel must touch at least
(the footprint of the whole nest), is 1 for perfect reuse and grows with every reload. Footprints come from
interval arithmetic on the region bounds (``tvm.sym``): exact for the affine indexing our templates and
MetaSchedule's tiling produce, an over-estimate where loops are fused (floordiv / floormod).

Cache sizes, vector width and registers are :class:`~tvm_fusion_ext.targets.TargetInfo`'s (a CPU target's caches
are this machine's): features are about the machine the candidates run on, as the measurements are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import tvm

from ..targets import TargetInfo
from ..tir_nodes import collect, substitute

FEATURE_NAMES = (
    "parallel_extent_log2", "parallel_balance", "tasks_per_core_log2",
    "vector_fraction", "vector_aligned_fraction", "vector_lanes_log2", "vector_contiguous",
    "register_tile_ratio", "accumulator_vectors_log2", "inner_accumulator_vectors_log2",
    "task_working_set_l2_log2", "l1_traffic_log2", "l2_traffic_log2", "unroll_log2",
    "threads_per_block_ratio", "shared_memory_ratio", "register_ratio",
)


@dataclass(frozen=True)
class Machine:
    cores: int
    lanes: int            # fp32 SIMD lanes
    register_bytes: int   # vector register file
    l1_bytes: int
    l2_bytes: int


def machine_of(target) -> Machine:
    """The facts the features divide by, all from :class:`~tvm_fusion_ext.targets.TargetInfo`. On CUDA one
    thread block is the unit: its register file is one thread's registers, and both cache levels stand for
    the block's shared memory."""
    info = TargetInfo.of(target)
    if info.is_cuda:
        return Machine(cores=1, lanes=info.lanes(), register_bytes=4 * info.max_registers_per_thread,
                       l1_bytes=info.max_shared_memory_per_block, l2_bytes=info.max_shared_memory_per_block)
    return Machine(cores=info.cores, lanes=info.lanes(), register_bytes=info.vector_register_bytes,
                   l1_bytes=info.l1_bytes, l2_bytes=info.l2_bytes)


# ----------------------------------------------------------------------------------------------- IR walk

@dataclass
class _Block:
    name: str
    loops: list            # For nodes, outermost first
    realize: object        # SBlockRealize
    volume: float          # iterations of the block

    @property
    def block(self):
        return self.realize.block


def _blocks(func) -> List[_Block]:
    from .expert import child_stmts

    out: List[_Block] = []

    def visit(node, loops):
        if isinstance(node, tvm.tirx.For):
            loops = loops + [node]
        if type(node).__name__ == "SBlockRealize" and len(node.block.iter_vars):
            volume = 1.0
            for lp in loops:
                volume *= _extent(lp)
            out.append(_Block(str(node.block.name_hint), loops, node, volume))
        for child in child_stmts(node):
            visit(child, loops)

    visit(func.body, [])
    return out


def _extent(loop) -> int:
    ext = loop.extent
    return int(ext.value) if isinstance(ext, tvm.tirx.IntImm) else 1


def _bytes(buf) -> int:
    return max(1, tvm.runtime.DataType(str(buf.dtype)).bits // 8)


class _Footprint:
    """Distinct bytes a block touches (``writes_only``: writes) while the loops from ``level`` inwards run
    (outer loops fixed)."""

    def __init__(self, blk: _Block, writes_only: bool = False):
        import tvm.sym

        self.blk = blk
        self.analyzer = tvm.sym.Analyzer()
        binding = {iv.var: val for iv, val in zip(blk.block.iter_vars, blk.realize.iter_values)}
        self.regions = []
        seen = set()
        for region in ([] if writes_only else list(blk.block.reads)) + list(blk.block.writes):
            buf = region.source if hasattr(region, "source") else region.buffer
            dims = []
            for rng, size in zip(region.region, buf.shape):
                lo = substitute(rng.min, binding)
                dims.append((lo, _const(rng.extent), _const(size)))
            key = (str(buf.name), tuple(str(d[0]) for d in dims))
            if key in seen:
                continue
            seen.add(key)
            self.regions.append((buf, dims))
        self.cache: Dict[int, float] = {}

    def at(self, level: int) -> float:
        if level not in self.cache:
            import tvm.sym

            dom = {}
            for i, lp in enumerate(self.blk.loops):
                ext = _extent(lp)
                dom[lp.loop_var] = tvm.sym.IntervalSet(0, ext - 1) if i >= level else tvm.sym.IntervalSet(0, 0)
            per_buffer: Dict[str, float] = {}
            for buf, dims in self.regions:
                elems = 1.0
                for lo, ext, size in dims:
                    span = self.analyzer.int_set(lo, dom)
                    try:
                        width = int(span.max_value) - int(span.min_value) + (ext or 1)
                    except (TypeError, ValueError):
                        width = size or 1
                    elems *= max(1, min(width, size) if size else width)
                name = str(buf.name)
                per_buffer[name] = max(per_buffer.get(name, 0.0), elems * _bytes(buf))
            self.cache[level] = float(sum(per_buffer.values()))
        return self.cache[level]


def _const(expr) -> Optional[int]:
    return int(expr.value) if isinstance(expr, tvm.tirx.IntImm) else None


# ----------------------------------------------------------------------------------------------- features

def expert_features(func, target, machine: Optional[Machine] = None) -> np.ndarray:
    """The :data:`FEATURE_NAMES` vector of scheduled PrimFunc ``func`` on ``target``."""
    from tvm.tirx import ForKind

    m = machine or machine_of(target)
    blocks = [b for b in _blocks(func) if b.volume > 0]
    feats = dict.fromkeys(FEATURE_NAMES, 0.0)
    if not blocks:
        return np.zeros(len(FEATURE_NAMES), dtype=np.float32)
    heavy = max(blocks, key=lambda b: (_is_reduction(b), b.volume))
    total = sum(b.volume for b in blocks)

    par = [lp for lp in heavy.loops if lp.kind == ForKind.PARALLEL]
    extent = math.prod(_extent(lp) for lp in par) if par else 1
    feats["parallel_extent_log2"] = math.log2(extent) if par else 0.0
    feats["parallel_balance"] = extent / (math.ceil(extent / m.cores) * m.cores)
    feats["tasks_per_core_log2"] = math.log2(extent / m.cores)

    vec_volume = aligned_volume = 0.0
    for b in blocks:
        vec = _vector_loop(b)
        if vec is not None:
            vec_volume += b.volume
            if _extent(vec) % m.lanes == 0:
                aligned_volume += b.volume
    feats["vector_fraction"] = vec_volume / total
    feats["vector_aligned_fraction"] = aligned_volume / total
    vec = _vector_loop(heavy)
    feats["vector_lanes_log2"] = math.log2(_extent(vec)) if vec is not None else 0.0
    feats["vector_contiguous"] = float(vec is not None and _contiguous_store(heavy, vec))

    fp = _Footprint(heavy)
    levels = _reduction_levels(heavy)
    if levels:
        feats["register_tile_ratio"] = fp.at(levels[-1] + 1) / m.register_bytes
        written = _Footprint(heavy, writes_only=True)
        vector_bytes = 4 * m.lanes
        feats["accumulator_vectors_log2"] = math.log2(written.at(levels[0] + 1) / vector_bytes)
        feats["inner_accumulator_vectors_log2"] = math.log2(written.at(levels[-1] + 1) / vector_bytes)
    first_par = next((i for i, lp in enumerate(heavy.loops) if lp.kind == ForKind.PARALLEL), None)
    task_level = first_par + 1 if first_par is not None else 0
    feats["task_working_set_l2_log2"] = math.log2(max(fp.at(task_level), 1.0) / m.l2_bytes)

    compulsory = l1 = l2 = 0.0
    for b in blocks:
        f = fp if b is heavy else _Footprint(b)
        compulsory += f.at(0)
        l1 += _traffic(b, f, m.l1_bytes)
        l2 += _traffic(b, f, m.l2_bytes)
    feats["l1_traffic_log2"] = math.log2(max(l1, 1.0) / max(compulsory, 1.0))
    feats["l2_traffic_log2"] = math.log2(max(l2, 1.0) / max(compulsory, 1.0))
    feats["unroll_log2"] = math.log2(1 + _max_unroll(blocks))
    if TargetInfo.of(target).is_cuda:
        feats.update(_cuda_pressure(func, target))
    return np.array([feats[n] for n in FEATURE_NAMES], dtype=np.float32)


def _is_reduction(b: _Block) -> bool:
    return any(int(iv.iter_type) == tvm.tirx.IterVar.CommReduce for iv in b.block.iter_vars)


def _vector_loop(b: _Block):
    from tvm.tirx import ForKind

    for lp in reversed(b.loops):
        if lp.kind == ForKind.VECTORIZED:
            return lp
    return None


def _uses(expr, var) -> bool:
    return any(v.same_as(var) for v in collect(expr, tvm.tirx.Var))


def _contiguous_store(b: _Block, vec) -> bool:
    """The vector loop indexes only the last axis of the stored region, with stride 1."""
    import tvm.sym

    binding = {iv.var: val for iv, val in zip(b.block.iter_vars, b.realize.iter_values)}
    analyzer = tvm.sym.Analyzer()
    for region in b.block.writes:
        rngs = list(region.region)
        if not rngs:
            continue
        idx = [substitute(r.min, binding) for r in rngs]
        if any(_uses(e, vec.loop_var) for e in idx[:-1]):
            return False
        last = idx[-1]
        step = analyzer.simplify(substitute(last, {vec.loop_var: vec.loop_var + 1}) - last)
        if not (isinstance(step, tvm.tirx.IntImm) and int(step.value) == 1):
            return False
    return True


def _reduction_levels(b: _Block) -> List[int]:
    """Indices (outermost first) of the block's loops that run a reduction axis."""
    reduce_vals = [val for iv, val in zip(b.block.iter_vars, b.realize.iter_values)
                   if int(iv.iter_type) == tvm.tirx.IterVar.CommReduce]
    return [i for i, lp in enumerate(b.loops) if _extent(lp) > 1 and any(_uses(v, lp.loop_var) for v in reduce_vals)]


def _traffic(b: _Block, fp: _Footprint, capacity: int) -> float:
    """Bytes loaded into a cache of ``capacity``: the outermost fitting loop level, once per outer iteration."""
    outer = 1.0
    for level, lp in enumerate(b.loops):
        if fp.at(level) <= capacity:
            return fp.at(level) * outer
        outer *= _extent(lp)
    return fp.at(len(b.loops)) * outer


def _max_unroll(blocks: List[_Block]) -> int:
    best = 0
    for b in blocks:
        for lp in b.loops:
            step = (lp.annotations or {}).get("pragma_auto_unroll_max_step")
            if step is not None:
                best = max(best, int(step.value) if hasattr(step, "value") else int(step))
    return best


def _cuda_pressure(func, target) -> dict:
    """Threads, shared memory and registers against the target's limits (the expert rules' estimates)."""
    from . import expert

    info = TargetInfo.of(target)
    threads: Dict[str, int] = {}
    for loop in expert.for_loops(func.body):
        if loop.kind == tvm.tirx.ForKind.THREAD_BINDING and loop.thread_binding is not None:
            tag = str(loop.thread_binding.thread_tag)
            if tag.startswith("threadIdx"):
                threads[tag] = max(threads.get(tag, 1), _extent(loop))
    per_block = math.prod(threads.values()) if threads else 1
    out = {"threads_per_block_ratio": per_block / info.max_threads_per_block}
    try:
        from tvm.s_tir.analysis import calculate_allocated_bytes

        lowered = expert.lower_for_limits(func, target)
        sizes = {str(k): int(v) for k, v in dict(calculate_allocated_bytes(lowered["main"])).get("main", {}).items()}
    except Exception:  # noqa: BLE001  (not lowerable here: VerifyGPUCode decides; no pressure figure)
        return out
    out["shared_memory_ratio"] = sum(v for k, v in sizes.items() if k.startswith("shared")) / \
        info.max_shared_memory_per_block
    local = sizes.get("local", 0)
    warp_wide = expert.warp_fragment_bytes(func, lowered["main"])
    local += warp_wide // expert.WARP - warp_wide
    out["register_ratio"] = (expert.BASE_REGISTERS + (local + 3) // 4) / info.max_registers_per_thread
    return out


def candidate_features(mod, target, machine: Optional[Machine] = None) -> np.ndarray:
    """:func:`expert_features` of the (single) PrimFunc of a scheduled module."""
    for _, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            return expert_features(func, target, machine)
    return np.zeros(len(FEATURE_NAMES), dtype=np.float32)
