"""Expert hard rules (Faith-style) that discard a candidate before it is built or measured.

MetaSchedule runs postprocessors on every sampled candidate inside the search strategy, before the builder
sees it; a postprocessor returning ``False`` drops the candidate. :class:`ExpertRules` is such a
postprocessor. Its rules read every limit from :class:`~tvm_fusion_ext.targets.TargetInfo`, never from
constants:

* ``shared_memory``  shared (static + dynamic) bytes per block > ``max_shared_memory_per_block``
* ``threads``        threads per block > ``max_threads_per_block``
* ``registers``      register estimate (local bytes / 4 + a base per thread, times threads) >
                     ``registers_per_block``, or > 255 per thread; a warp-wide mma fragment ([32 lanes,
                     8 values]) counts its 8 values per thread
* ``tensor_core``    a tensor-core fragment (``wmma.*`` / ``m16n8k8.*`` buffer) not a multiple of its tile
* ``vector_width``   a vectorised loop the hardware cannot issue as whole vectors: CUDA: more than 16 bytes
                     or not a power of two; CPU: neither a multiple nor a divisor of the SIMD width

Shared and local sizes are read after the same buffer compaction MetaSchedule's ``VerifyGPUCode`` runs (an
unlowered schedule still declares cached buffers at full size). Rejections are counted per rule in
:attr:`ExpertRules.stats`, shared by clones, and written to the manifest by the driver.
"""

from __future__ import annotations

import threading
from typing import Dict, Optional

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.postproc import PyPostproc
from tvm.tirx import ForKind

from ..schedules.cuda.tensorcore import LOCAL, WARP
from ..targets import TargetInfo

RULES = ("shared_memory", "threads", "registers", "tensor_core", "vector_width")
# A thread needs registers beyond its arrays (indices, addresses, loop counters): ptxas reports ~24-40 for
# our simple kernels (guide §5), so 32 is the base of the estimate.
BASE_REGISTERS = 32
FRAGMENT_VALUES = LOCAL  # values per lane of a 16×16 mma fragment
FRAGMENT_TILES = {"wmma.matrix_a": 16, "wmma.matrix_b": 16, "wmma.accumulator": 16,
                  "m16n8k8.matrixA": 8, "m16n8k8.matrixB": 8, "m16n8k8.matrixC": 8}


class RuleStats:
    """Thread-safe counters (the search applies postprocessors from several threads)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.checked = 0
        self.rejected: Dict[str, int] = {r: 0 for r in RULES}

    def add(self, rule: Optional[str]) -> None:
        with self._lock:
            self.checked += 1
            if rule is not None:
                self.rejected[rule] = self.rejected.get(rule, 0) + 1

    def to_dict(self) -> dict:
        with self._lock:
            return {"checked": self.checked, "rejected": dict(self.rejected),
                    "rejected_total": sum(self.rejected.values())}


# ----------------------------------------------------------------------------------------------- IR walks

def child_stmts(node):
    """The statements directly under ``node``: one step of a walk over a TIR body."""
    for name in ("body", "then_case", "else_case", "block", "init"):
        child = getattr(node, name, None)
        if isinstance(child, tvm.tirx.Stmt):
            yield child
    seq = getattr(node, "seq", None)
    if seq is not None:
        yield from seq


def for_loops(stmt):
    """Every For node under ``stmt`` (s_tir functions: loops sit inside SBlockRealize/SBlock bodies)."""
    stack = [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, tvm.tirx.For):
            yield node
        stack.extend(child_stmts(node))


def _int(expr) -> Optional[int]:
    return int(expr.value) if isinstance(expr, tvm.tirx.IntImm) else None


def _bits(dtype) -> int:
    return tvm.runtime.DataType(str(dtype)).bits


def _fragment_buffers(func):
    """Buffers allocated in blocks of ``func`` (where cache_read/write and tensor-core scopes live)."""
    stack = [func.body]
    while stack:
        node = stack.pop()
        for buf in getattr(node, "alloc_buffers", None) or []:
            yield buf
        stack.extend(child_stmts(node))


def lower_for_limits(func, target) -> tvm.IRModule:
    """The buffer-compaction part of MetaSchedule's VerifyGPUCode lowering: enough to size allocations."""
    from tvm.s_tir import transform as st
    from tvm.tirx import transform as tt

    func = func.with_attr("global_symbol", "main").with_attr("target", target)
    passes = [st.LowerCrossThreadReduction(), st.LowerInitBlock(), st.PlanAndUpdateBufferAllocationLocation(),
              st.ConvertBlocksToOpaque(), st.LiftThreadBinding(), st.ManifestSharedMemoryLocalStage(),
              st.CompactBufferAllocation(), tt.StmtSimplify(), st.LowerAutoCopy(), st.UnifyThreadBinding(),
              st.LowerMatchBuffer(), st.LowerOpaqueBlock(), tt.FlattenBuffer()]
    return tvm.transform.Sequential(passes)(tvm.IRModule({"main": func}))


# ----------------------------------------------------------------------------------------------- rules

def check(func, target) -> Optional[str]:
    """The first rule ``func`` (a scheduled s_tir PrimFunc) breaks on ``target``, or None."""
    info = TargetInfo.of(target)
    gpu = info.is_cuda
    threads: Dict[str, int] = {}
    for loop in for_loops(func.body):
        extent = _int(loop.extent)
        if loop.kind == ForKind.THREAD_BINDING and loop.thread_binding is not None:
            tag = str(loop.thread_binding.thread_tag)
            if tag.startswith("threadIdx") and extent is not None:
                threads[tag] = max(threads.get(tag, 1), extent)
        elif loop.kind == ForKind.VECTORIZED and extent is not None:
            if _vector_rule_broken(loop, extent, info):
                return "vector_width"
    if not gpu:
        return None
    per_block = 1
    for extent in threads.values():
        per_block *= extent
    if per_block > info.max_threads_per_block:
        return "threads"
    for buf in _fragment_buffers(func):
        tile = FRAGMENT_TILES.get(str(buf.scope()))
        dims = [_int(d) for d in buf.shape[-2:]]
        if tile and any(d is None or d % tile for d in dims):
            return "tensor_core"
    try:
        lowered = lower_for_limits(func, target)
    except Exception:  # noqa: BLE001  (unlowerable here = VerifyGPUCode rejects it too; not our rule)
        return None
    from tvm.s_tir.analysis import calculate_allocated_bytes

    sizes = {str(k): int(v) for k, v in dict(calculate_allocated_bytes(lowered["main"])).get("main", {}).items()}
    shared = sum(v for k, v in sizes.items() if k.startswith("shared"))
    if shared > info.max_shared_memory_per_block:
        return "shared_memory"
    local = sizes.get("local", 0)
    warp_wide = warp_fragment_bytes(func, lowered["main"])
    local += warp_wide // WARP - warp_wide  # each lane holds 1/32 of a warp-wide fragment
    regs = BASE_REGISTERS + (local + 3) // 4
    if regs > info.max_registers_per_thread or regs * per_block > info.registers_per_block:
        return "registers"
    return None


def warp_fragment_bytes(func, lowered) -> int:
    """Bytes of the local buffers that hold mma fragments of a whole warp.

    Our tensor-core templates (``schedules/cuda/tensorcore.py``) declare a 16×16 fragment as a [32 lanes,
    8 values] "local" buffer although every thread keeps only its own 8 values: counting the whole buffer
    would estimate 32× the registers and reject every tensor-core candidate."""
    names = {buf.name for buf in _fragment_buffers(func)
             if buf.scope() == "local" and [_int(d) for d in buf.shape[-2:]] == [WARP, FRAGMENT_VALUES]}
    total, stack = 0, [lowered.body]
    while stack:
        node = stack.pop()
        if type(node).__name__ == "AllocBuffer" and node.buffer.name in names:
            n = 1
            for d in node.buffer.shape:
                n *= _int(d) or 0
            total += n * _bits(node.buffer.dtype) // 8
        stack.extend(child_stmts(node))
    return total


def _vector_rule_broken(loop, extent: int, info: TargetInfo) -> bool:
    bits = _store_bits(loop)
    if info.is_cuda:
        return extent & (extent - 1) != 0 or extent * bits > info.vector_bits
    lanes = max(1, info.vector_bits // bits)
    return extent % lanes != 0 and lanes % extent != 0


def _region_buffer(region):
    return region.source if hasattr(region, "source") else region.buffer


def _store_bits(loop) -> int:
    """Element width of what the vector loop stores (fp32 when nothing is found)."""
    stack = [loop.body]
    while stack:
        node = stack.pop()
        if isinstance(node, tvm.tirx.BufferStore):
            return _bits(node.buffer.dtype)
        if type(node).__name__ == "SBlock":
            if len(node.writes):
                return _bits(_region_buffer(node.writes[0]).dtype)
        stack.extend(child_stmts(node))
    return 32


# ----------------------------------------------------------------------------------------------- postproc

@derived_object
class ExpertRules(PyPostproc):
    """Postprocessor: ``False`` (candidate dropped before building) when :func:`check` finds a broken rule."""

    def __init__(self, stats: Optional[RuleStats] = None, target=None):
        super().__init__()
        self.stats = stats if stats is not None else RuleStats()
        self.target = target

    def _initialize_with_tune_context(self, context) -> None:
        if context.target is not None:
            self.target = context.target

    def apply(self, sch) -> bool:
        rule = None
        try:
            for _, func in sch.mod.functions_items():
                if isinstance(func, tvm.tirx.PrimFunc):
                    rule = check(func, self.target)
                    if rule is not None:
                        break
        except Exception:  # noqa: BLE001  (a rule that cannot read a candidate must not stop the search)
            rule = None
        self.stats.add(rule)
        return rule is None

    def clone(self):
        return ExpertRules(self.stats, self.target)
