"""Design spaces: per task, our template's knobs ("template") or MetaSchedule's generated sketches ("auto").

Templates are registered as MetaSchedule custom rules (``s_tir.meta_schedule.<family>.<rule>``); the
registered rule either applies the template or, for an auto task, removes the block's ``schedule_rule`` so
that the default rules see the block. Spaces are generated once, before tuning, and handed to MetaSchedule
as a fixed space (:func:`fixed_space_class`): that is how one run mixes template and auto tasks. Where
"auto" sketches cannot be generated (MultiLevelTiling crashes on the attention kernel on llvm) the task
falls back to its template; a task without a template uses "auto" in either mode.
"""

from __future__ import annotations

from typing import List, Optional

import tvm

from ..targets import TargetInfo
from .expert import ExpertRules, RuleStats
from .tasks import Task

SPACES = ("template", "auto")


# ----------------------------------------------------------------------------------------------- custom rules

class _RuleState:
    """What the registered custom rules do when design spaces are generated (single-threaded, by us)."""

    target: Optional[tvm.target.Target] = None
    mode = "template"


_REGISTERED: set = set()


def register_custom_rules() -> List[str]:
    """Register every template as ``s_tir.meta_schedule.<family>.<rule>`` for MetaSchedule's ApplyCustomRule."""
    import tvm_ffi

    from ..schedules.registry import registered

    names = []
    for (rule, family), template in registered().items():
        name = f"s_tir.meta_schedule.{family}.{rule}"
        names.append(name)
        if name not in _REGISTERED:
            tvm_ffi.register_global_func(name, _custom_rule(template), override=True)
            _REGISTERED.add(name)
    return names


def _custom_rule(template):
    from ..schedules.rule import root_blocks

    def apply(sch, block):
        if _RuleState.mode == "auto" or template.decline(sch, block, _RuleState.target) is not None:
            # Remove every schedule_rule (the epilogue's "None" too): PostOrderApply lets the default rules
            # touch only unannotated blocks. Unannotate is in the trace, so records replay on the original.
            for blk in root_blocks(sch):
                if "schedule_rule" in sch.get(blk).annotations:
                    sch.unannotate(blk, "schedule_rule")
            return [sch]
        template(sch, block, _RuleState.target, None)
        return [sch]

    return apply


# ----------------------------------------------------------------------------------------------- spaces

def _meta_schedule_preset(target) -> str:
    """The name MetaSchedule keys its rule, postproc and mutator presets by: TVM's kind name ("llvm" | "cuda",
    :attr:`TargetInfo.kind`), not our template family (:attr:`TargetInfo.family`, "cpu" | "cuda")."""
    return TargetInfo.of(target).kind


def postprocs(target, space: str, stats: RuleStats) -> list:
    from tvm.s_tir import meta_schedule as ms

    expert = ExpertRules(stats, target)
    gpu = TargetInfo.of(target).is_cuda
    if space == "template":
        # The templates parallelise/vectorise themselves: RewriteParallelVectorizeUnroll would fight them
        # (every sample failed on the parallel dense kernel: "Cannot sample enough initial population").
        post = [ms.postproc.DisallowDynamicLoop()]
        if gpu:
            post += [ms.postproc.RewriteCooperativeFetch(), ms.postproc.RewriteUnboundBlock()]
        post += [ms.postproc.RewriteReductionBlock()]
    else:
        # RewriteLayout would move weight layouts into the graph; our dense weights are pre-packed already.
        post = [p for p in ms.postproc.Postproc.create(_meta_schedule_preset(target)) if "RewriteLayout" not in type(p).__name__]
    if gpu and space == "template":
        post.append(ms.postproc.VerifyGPUCode())
    # Expert rules first among the checks, after the rewrites that produce the final loop nest.
    verify = [p for p in post if "Verify" in type(p).__name__]
    return [p for p in post if p not in verify] + [expert] + verify


def mutators(target, space: str) -> dict:
    from tvm.s_tir import meta_schedule as ms

    if space == "template":
        # MutateTileSize changes sample_perfect_tile knobs; categorical knobs are re-sampled by evolution.
        return {ms.mutator.MutateTileSize(): 1.0}
    return ms.mutator.Mutator.create(_meta_schedule_preset(target))


def _probe_space(target, space: str, stats: RuleStats):
    from tvm.s_tir import meta_schedule as ms

    rules = [ms.schedule_rule.ApplyCustomRule()] if space == "template" else \
        ms.schedule_rule.ScheduleRule.create(_meta_schedule_preset(target))
    return ms.space_generator.PostOrderApply(sch_rules=rules, postprocs=postprocs(target, space, stats),
                                             mutator_probs=mutators(target, space))


def _generate(task: Task, target, space: str, seed: int) -> list:
    from tvm.s_tir import meta_schedule as ms

    _RuleState.target, _RuleState.mode = target, space
    try:
        ctx = ms.TuneContext(mod=task.mod, target=target, space_generator=_probe_space(target, space, task.stats),
                             task_name=task.name, rand_state=seed, num_threads=1)
        return list(ctx.generate_design_space())
    finally:
        _RuleState.mode = "template"


def choose_space(task: Task, target, space: str, seed: int = 1) -> bool:
    """Generate the task's design spaces in ``space`` (with the fallbacks above); False: nothing to tune."""
    order = [space] + [s for s in SPACES if s != space]
    if task.rule is None:
        order = ["auto"]
    for kind in order:
        try:
            spaces = _generate(task, target, kind, seed)
        except Exception as err:  # noqa: BLE001  (ScheduleError etc. from MetaSchedule's rules)
            task.note = f"{kind} space failed: {one_line(err)}"
            continue
        if spaces:
            if kind != space:
                task.note = (task.note + "; " if task.note else "") + f"using {kind}"
            task.space, task.spaces = kind, spaces
            return True
    return False


def one_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else type(err).__name__)[:200]


def replay(mod: tvm.IRModule, sch):
    """A fresh copy of design space ``sch`` of ``mod``: its trace replayed on the module.

    ``Schedule.copy()`` fails in 0.27 on every tensorized schedule ("unordered_map::at": our fp16/bf16 dense
    and attention templates); the replay gives a structurally equal module, and it is what MetaSchedule's
    search does with traces anyway."""
    from tvm import s_tir

    fresh = s_tir.Schedule(mod)
    sch.trace.apply_to_schedule(fresh, remove_postproc=False)
    return fresh


def fixed_space_class():
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.space_generator import PySpaceGenerator

    @derived_object
    class FixedSpace(PySpaceGenerator):
        """Design spaces generated beforehand (by :func:`choose_space`), with their postprocs and mutators."""

        def __init__(self, spaces, postprocs, mutator_probs):
            super().__init__()
            self.spaces, self.postprocs, self.mutator_probs = list(spaces), postprocs, mutator_probs
            self.sch_rules = []

        def _initialize_with_tune_context(self, context) -> None:
            # What SpaceGenerator's own initialisation does; mutators read the target (e.g. MutateParallel).
            for p in self.postprocs:
                p._initialize_with_tune_context(context)  # noqa: SLF001
            for m in self.mutator_probs:
                m._initialize_with_tune_context(context)  # noqa: SLF001

        def generate_design_space(self, mod):
            return [replay(mod, s) for s in self.spaces]

        def clone(self):
            return FixedSpace(self.spaces, [p.clone() for p in self.postprocs],
                              {m.clone(): float(v) for m, v in self.mutator_probs.items()})

    return FixedSpace
