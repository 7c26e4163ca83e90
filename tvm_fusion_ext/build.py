"""The build path: targets, the one shared lowering, and the build itself.

``lower`` is the only way a module reaches TIR in this package: the tuner extracts its tasks from
``lower(mod, target)`` and ``build`` schedules ``lower(mod, target)``, so a tuning record always finds its
workload again. ``build`` then schedules in order of trust: tuning records, template default knobs for our
fused operators, and a generic fallback for everything else (CPU: ours; CUDA: dlight). The last step is
``tvm.compile`` with the backend's own dataflow-lowering and finalisation passes only, since legalisation,
fusion and scheduling have already happened here (the stock CPU ``tvm.compile`` pipeline would do no
fusion and no scheduling at all).
"""

from __future__ import annotations

import os
import warnings
from typing import Optional, Union

import tvm
from tvm import relax

from .errors import TargetError, TuningLogError
from .targets import resolve_target
from .ops.registry import call_op, inputs_of, op_of, params_of

TargetLike = Union[tvm.target.Target, dict, str, None]

# ----------------------------------------------------------------------------------------------- targets
# One parser for what users type (tvm_fusion_ext.targets); these names are this module's public surface.
as_target = resolve_target


def default_target(kind: str = "llvm") -> tvm.target.Target:
    """This machine's CPU (``kind="llvm"``) or GPU (``kind="cuda"``) as a complete Target."""
    if kind not in ("llvm", "cuda"):
        raise TargetError(f"unknown target kind '{kind}' (known: llvm, cuda)")
    return resolve_target(kind)


def _is_cpu(target: tvm.target.Target) -> bool:
    return target.kind.name == "llvm"


def configure_cpu_threads(num_threads: Optional[int] = None) -> int:
    """Give TVM's CPU thread pool one thread per usable core; returns the thread count in effect.

    TVM sizes its pool to half the logical CPUs (it assumes SMT siblings), which on a 2-vCPU VM is a single
    thread: every ``T.parallel`` loop then runs serially. The environment variable also reaches the
    processes MetaSchedule's runner spawns to measure candidates."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    n = max(1, min(int(num_threads or len(cpus)), len(cpus)))
    os.environ.setdefault("TVM_NUM_THREADS", str(n))
    current = int(tvm.get_global_func("runtime.NumThreads")())
    if current < n:
        # -3 = kSpecifyThreadShareAllCore: n workers free to run on any of these cores (no strict pinning,
        # which would hurt when other processes share the machine).
        tvm.get_global_func("runtime.config_threadpool")(-3, n, [str(c) for c in cpus])
        current = int(tvm.get_global_func("runtime.NumThreads")())
    return current


# ----------------------------------------------------------------------------------------------- lowering

@relax.expr_functor.mutator
class _RederiveOps(relax.PyExprMutator):
    """Re-derives our operator calls for a target: ``rule(mutator, op, args, params)`` returns the new
    ``(args, params)`` of a call, or None to keep it. Ops are TE computes, so a new parameter set is a new
    PrimFunc; the old one is dropped by dead-code elimination."""

    def __init__(self, mod: tvm.IRModule, rule):
        super().__init__(mod)
        self.mod = mod
        self.rule = rule
        self.changed = 0

    def constant(self, expr):
        if isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            expr = bound if bound is not None else expr
        return expr if isinstance(expr, tvm.ir.GenericConst) else None

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if call.op != tvm.ir.Op.get("relax.call_tir") or not isinstance(call.args[0], relax.GlobalVar):
            return call
        func = self.mod[call.args[0]]
        op = op_of(func) if isinstance(func, tvm.tirx.PrimFunc) else None
        if op is None:
            return call
        new = self.rule(self, op, dict(zip(inputs_of(func), call.args[1].fields)), params_of(func))
        if new is None:
            return call
        self.changed += 1
        return call_op(self.builder_, op, *new)


def _rederive_pass(name: str, rule) -> tvm.transform.Pass:
    @tvm.transform.module_pass(opt_level=0, name=name)
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mutator = _RederiveOps(mod, rule)
        for gv, func in list(mod.functions_items()):
            if isinstance(func, relax.Function):
                mutator.builder_.update_func(gv, mutator.visit_expr(func))
        if not mutator.changed:
            return mod
        return relax.transform.DeadCodeElimination()(mutator.builder_.get())

    return _pass


def PackDenseWeights(target: tvm.target.Target) -> tvm.transform.Pass:  # noqa: N802
    """CPU: pre-pack constant ``fused_dense`` weights into the template's (N/nr, K, nr) panels."""
    from .ops.dense import pack_weight
    from .schedules.cpu.dense import pack_nr

    def rule(mutator, op, args, params):
        if op != "fused_dense" or params.get("w_layout", "plain") != "plain":
            return None
        w = mutator.constant(args["w"])
        if w is None:
            return None
        w_np = w.value.numpy()
        transpose_b = bool(params.get("transpose_b", False))
        n = int(w_np.shape[0] if transpose_b else w_np.shape[1])
        args = dict(args, w=relax.const(pack_weight(w_np, pack_nr(n, target), transpose_b)))
        return args, dict(params, w_layout="packed", out_features=n, transpose_b=False)

    if not _is_cpu(target):
        return tvm.transform.Sequential([], name="tfx.PackDenseWeights")
    return _rederive_pass("tfx.PackDenseWeights", rule)


def TensorCoreAttentionBlocks(target: tvm.target.Target) -> tvm.transform.Pass:  # noqa: N802
    """CUDA: 16-bit ``fused_attention`` with the key block its tensor-core template is sized for.

    The key block sets the score and operand tiles in shared memory; the CPU default (up to 128 keys) would
    leave room for a single warp per block in 48 KiB."""
    from .ops.attention import LOW_PRECISION
    from .schedules.cuda.attention_mma import KEY_BLOCK

    def rule(mutator, op, args, params):
        if op != "fused_attention" or str(args["q"].ty.dtype) not in LOW_PRECISION:
            return None
        keys = int(args["k"].ty.shape[2 if params.get("k_layout", "BSHD") == "BHSD" else 1])
        if keys < KEY_BLOCK or params.get("key_block") == KEY_BLOCK:
            return None
        return args, dict(params, key_block=KEY_BLOCK)

    if target.kind.name != "cuda":
        return tvm.transform.Sequential([], name="tfx.TensorCoreAttentionBlocks")
    return _rederive_pass("tfx.TensorCoreAttentionBlocks", rule)


def VectorisableMath(target: tvm.target.Target) -> tvm.transform.Pass:  # noqa: N802
    """CPU: fp32 ``erf``/``exp``/``sigmoid``/``tanh`` -> the arithmetic forms of :mod:`.ops.fastmath`. LLVM
    lowers them to one scalar libm call per lane, which made a stock erf-GELU epilogue cost as much as its
    GEMM and MiniLM's softmax (12×128×128) take over a millisecond."""
    import tvm_ffi

    from .ops.fastmath import REPLACEMENTS

    ops = {tvm.ir.Op.get(name): fn for name, fn in REPLACEMENTS.items()}

    def rewrite(call):
        if isinstance(call.op, tvm.ir.Op):
            for op, fn in ops.items():
                if call.op.same_as(op):
                    return fn(call.args[0])
        return call

    @tvm.transform.module_pass(opt_level=0, name="tfx.VectorisableMath")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not _is_cpu(target):
            return mod
        out = None
        for gv, func in list(mod.functions_items()):
            if isinstance(func, tvm.tirx.PrimFunc):
                new = tvm_ffi.structural_map(func, (tvm.ir.expr.Call, rewrite))
                if not new.same_as(func):
                    out = out if out is not None else mod.clone()  # a Python module pass gets the caller's module
                    out[gv] = new
        return out if out is not None else mod

    return _pass


def lower(mod: tvm.IRModule, target: TargetLike = None) -> tvm.IRModule:
    """Relax (fused by SemanticFusion or not) -> Relax calling TIR PrimFuncs, none of them scheduled yet.

    The one lowering shared by tuning and building. Order: target re-derivation of our operators (weight
    packing), then the stock legalize/fuse passes, then CPU math rewrites (vectorisable exp/erf), then
    reshape-to-view rewriting, so that pure reshapes never become kernels (nor tuning tasks)."""
    target = as_target(target)
    from .transform.safe_gather import ClampGatherIndices

    passes = [
        ClampGatherIndices(),  # a bad token id must not read past the embedding table
        relax.backend.DispatchSampling(),
        relax.backend.DispatchSortScan(),
        PackDenseWeights(target),
        TensorCoreAttentionBlocks(target),
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        VectorisableMath(target),
        relax.transform.RewriteDataflowReshape(),
        relax.transform.DeadCodeElimination(),
    ]
    with target:
        return tvm.transform.Sequential(passes, name="tfx.lower")(mod)


# ----------------------------------------------------------------------------------------------- scheduling

def _main_rule_block(sch, target):
    from .schedules.registry import get_template

    for block in sch.get_child_blocks(sch.get_sblock("root")):
        rule = sch.get(block).annotations.get("schedule_rule")
        if rule is not None:
            template = get_template(str(rule), target)
            if template is not None:
                return block, template
    return None, None


def _is_scheduled(func) -> bool:
    return func.attrs is not None and "tirx.is_scheduled" in func.attrs and bool(func.attrs["tirx.is_scheduled"])


def ApplyTemplates(target: TargetLike = None, knobs: Optional[dict] = None) -> tvm.transform.Pass:  # noqa: N802
    """Schedule every not-yet-scheduled PrimFunc whose block carries a ``schedule_rule`` with a template for
    this target family, with the template's default knobs (or ``knobs[rule]``); marks it scheduled."""
    target = as_target(target)
    knobs = knobs or {}

    @tvm.transform.module_pass(opt_level=0, name="tfx.ApplyTemplates")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        from tvm import s_tir

        mod = mod.clone()  # a Python module pass gets the caller's module: never schedule it in place
        for gv, func in list(mod.functions_items()):
            if not isinstance(func, tvm.tirx.PrimFunc) or _is_scheduled(func):
                continue
            sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
            block, template = _main_rule_block(sch, target)
            if block is None:
                continue
            rule = str(sch.get(block).annotations["schedule_rule"])
            try:
                template(sch, block, target, knobs.get(rule))
            except Exception as err:  # noqa: BLE001  (a template bug must not break the build: fall back)
                warnings.warn(f"template '{rule}' failed on {gv.name_hint}; using the fallback schedule: "
                              f"{str(err).splitlines()[-1] if str(err) else type(err).__name__}")
                continue
            mod[gv] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
        return mod

    return _pass


def fallback_schedule(target: tvm.target.Target) -> tvm.transform.Pass:
    from tvm.s_tir import dlight as dl

    if _is_cpu(target):
        from .schedules.cpu.fallback import Fallback

        return dl.ApplyDefaultSchedule(Fallback())
    return dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
                                   dl.gpu.Fallback())


def apply_database(mod: tvm.IRModule, target: tvm.target.Target, logs: str) -> tvm.IRModule:
    from .tune.logs import open_database

    if not os.path.isdir(logs):
        raise TuningLogError(f"tuning-log directory '{logs}' does not exist")
    try:
        database = open_database(logs)  # cuts a half-written last line left by a killed tuning run
    except TuningLogError:
        raise
    except Exception as err:  # noqa: BLE001
        raise TuningLogError(f"cannot read tuning logs in '{logs}': {str(err).splitlines()[-1]}") from None
    if target.kind.name == "cuda":
        from .schedules.cuda.tensorcore import register_intrinsics

        register_intrinsics()  # tensor-core records replay traces that name our mma intrinsics
    with target, database:
        return relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)


def schedule(mod: tvm.IRModule, target: TargetLike = None, logs: Optional[str] = None,
             knobs: Optional[dict] = None) -> tvm.IRModule:
    """Schedule a lowered module: records from ``logs``, then templates, then the generic fallback."""
    target = as_target(target)
    if logs is not None:
        mod = apply_database(mod, target, logs)
    with target:
        mod = ApplyTemplates(target, knobs)(mod)
        return fallback_schedule(target)(mod)


def _finalize_pipeline(target: tvm.target.Target) -> tvm.transform.Pass:
    if target.kind.name == "cuda":
        from tvm.relax.backend.cuda import pipeline as backend
    else:
        from tvm.relax.backend.cpu_generic import pipeline as backend
    # No library dispatch / legalisation / fusion here: lower() did it, and schedule() did the rest.
    passes = backend.dataflow_lower_passes(target) + backend.finalize_passes(target)

    @tvm.transform.module_pass(opt_level=0, name="tfx.finalize")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


def build(mod: tvm.IRModule, target: TargetLike = None, logs: Optional[str] = None, fuse: bool = True,
          knobs: Optional[dict] = None):
    """Fuse (optionally), lower, schedule and compile ``mod``; returns the ``tvm.compile`` executable
    (run it with ``relax.VirtualMachine(ex, dev)``). CPU builds also size this process's TVM thread pool to
    the target's cores (:func:`configure_cpu_threads`)."""
    target = as_target(target)
    if logs is not None:
        from .tune.logs import select

        logs, message = select(logs, mod, target)  # a root of many record folders: the matching one, if any
        print(message)
    if fuse:
        from .transform.pipeline import SemanticFusion

        mod = SemanticFusion()(mod)
    mod = schedule(lower(mod, target), target, logs=logs, knobs=knobs)
    if _is_cpu(target):
        cores = target.attrs.get("num-cores") if target.attrs is not None else None
        configure_cpu_threads(int(cores) if cores else None)
    return tvm.compile(mod, target, relax_pipeline=_finalize_pipeline(target))
