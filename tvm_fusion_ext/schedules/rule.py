"""Schedule templates as rules: one per (operator block, target family), applied the way dlight applies its own.

A :class:`TemplateRule` is a dlight ``ScheduleRule``: ``apply(func, target, tunable)`` returns a schedule, or
``None`` when the rule does not apply, so templates, dlight's rules and our fallback compose in one
``ApplyDefaultSchedule`` loop (first rule that returns a schedule wins, the fallback comes last). A template
applies to a PrimFunc whose block is annotated ``schedule_rule = <block_rule>`` on a target of its
``family``, unless :meth:`TemplateRule.decline` gives a reason (a shape or dtype it was not written for).

Every tunable choice in :meth:`TemplateRule.schedule` is a MetaSchedule random variable (``sample_perfect_tile``
/ ``sample_categorical``) whose ``decision`` comes from the knobs when given, else from the template's expert
default for the shapes and target at hand. So one body serves three uses: the build without tuning records
(defaults), MetaSchedule's ``ApplyCustomRule`` (the trace holds the samples; the search mutates them), and
explicit knobs from a user or a test. A template must not branch on knob values (MetaSchedule replays the
trace with other decisions) and reads hardware facts from :class:`~tvm_fusion_ext.targets.TargetInfo`.

:meth:`TemplateRule.prepare_operator` lets a template ask for the operator parameters it is written for before
lowering (the CPU dense template's pre-packed weight panels, the tensor-core attention's key block), so the
compile path re-derives operators without knowing any template's internals.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any, ClassVar, Dict, Optional

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight import ScheduleRule

from ..errors import FusionExtError
from ..targets import TargetInfo

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Knobs:
    """Base of each template's typed knob set. A field left ``None`` takes the template's expert default.

    Values are MetaSchedule decisions as a trace records them: a ``sample_perfect_tile`` knob is the list of
    tile factors, a ``sample_categorical`` knob the *index* of the chosen candidate."""

    def get(self, name: str, default: Any = None) -> Any:
        value = getattr(self, name)
        return default if value is None else value

    @classmethod
    def of(cls, value) -> "Knobs":
        """``None`` (all defaults), a mapping of knob names, or an instance of this class."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            names = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(value) - names)
            if unknown:
                raise FusionExtError(f"unknown knob '{unknown[0]}' for {cls.__name__} (knobs: {', '.join(sorted(names))})")
            return cls(**value)
        raise FusionExtError(f"knobs must be a dict or {cls.__name__}, got {type(value).__name__}")


class TemplateRule(ScheduleRule):
    """One schedule template; subclasses set the class attributes and implement :meth:`schedule`."""

    #: the ``schedule_rule`` annotation of the operator block this template schedules ("tfx.dense")
    block_rule: ClassVar[str] = ""
    #: target family it serves ("cpu" | "cuda"), as :class:`TargetInfo` names them
    family: ClassVar[str] = ""
    #: the typed knob set
    Knobs: ClassVar[type] = Knobs

    def __init__(self, knobs=None, kernel_knobs=None):
        self.knobs = self.Knobs.of(knobs)
        #: a :class:`~.kernel_knobs.KernelKnobs`: tuned knobs per kernel signature, over ``knobs``
        self.kernel_knobs = kernel_knobs

    def with_knobs(self, knobs, kernel_knobs=None) -> "TemplateRule":
        """The same template with these knobs as its decisions (None: expert defaults), and ``kernel_knobs``
        (per-kernel knobs transferred from tuning records) over them where a kernel's signature has some."""
        return type(self)(knobs, kernel_knobs)

    def transferable_knobs(self, static: dict) -> dict:
        """The knobs of a tuned static kernel (``{name: decision}``, from its record) that keep their meaning
        on a kernel of the same signature with other or run-time rows, renamed as that kernel's path reads them.
        The default transfers nothing: a template says which of its knobs do not depend on the rows."""
        return {}

    def _knobs_for(self, sig: Optional[str]) -> "Knobs":
        extra = self.kernel_knobs.lookup(self.block_rule, sig) if self.kernel_knobs is not None else None
        if not extra:
            return self.knobs
        given = {f.name: getattr(self.knobs, f.name) for f in dataclasses.fields(self.knobs)}
        return self.Knobs.of({**{k: v for k, v in given.items() if v is not None}, **extra})

    def prepare(self, call, target: tvm.target.Target):
        """:meth:`prepare_operator` with the knobs transferred to this call's kernel, if any (the compile path's
        entry point; a row-padding knob such as the dense ``mr`` acts here)."""
        wanted = self.prepare_operator(call, target)
        if self.kernel_knobs is None:
            return wanted
        from .kernel_knobs import call_signature

        knobs = self._knobs_for(call_signature(wanted or call))
        return wanted if knobs is self.knobs else type(self)(knobs).prepare_operator(call, target)

    # -- what a subclass provides -----------------------------------------------------------------
    def decline(self, sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV,
                target: tvm.target.Target) -> Optional[str]:
        """Why this template does not take this kernel (None: it does). The default takes every kernel."""
        return None

    def schedule(self, sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, target: tvm.target.Target,
                 knobs: Optional[Knobs] = None) -> None:
        raise NotImplementedError

    def prepare_operator(self, call, target: tvm.target.Target):
        """The operator call this template wants instead of ``call`` (an :class:`~tvm_fusion_ext.ops.OperatorCall`),
        or None to keep it. Runs before lowering, for every fused-operator call of the model."""
        return None

    # -- dlight's ScheduleRule protocol -----------------------------------------------------------
    def is_target_available(self, target: tvm.target.Target) -> bool:
        return TargetInfo.of(target).family == self.family

    def apply(self, func: tirx.PrimFunc, target: tvm.target.Target, _tunable: bool) -> Optional[s_tir.Schedule]:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
        block = self.find_block(sch)
        if block is None:
            return None
        reason = self.decline(sch, block, target)
        if reason is not None:
            logger.info("%s declines %s: %s", type(self).__name__, _name(func), reason)
            return None
        knobs, sig = self.knobs, None
        if self.kernel_knobs is not None:
            from .kernel_knobs import kernel_signature

            sig = kernel_signature(func)
            knobs = self._knobs_for(sig)
        if knobs is not self.knobs:
            tuned = self._try_schedule(sch, block, target, knobs, func, "knobs transferred from tuning records")
            if tuned is not None:
                self.kernel_knobs.mark_scheduled(sig, func)
                return tuned
            sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)  # the failed attempt left it half done
            block = self.find_block(sch)
        return self._try_schedule(sch, block, target, self.knobs, func, None)

    def _try_schedule(self, sch, block, target, knobs, func, transferred: Optional[str]):
        try:
            self.schedule(sch, block, target, knobs)
        except FusionExtError:
            if transferred is None:
                raise  # bad knobs given by the user: say so instead of silently falling back
            return None
        except Exception as err:  # noqa: BLE001  (a template bug must not break the build: the fallback runs)
            text = str(err).strip().splitlines()
            instead = "its default knobs" if transferred else "the fallback schedule"
            warnings.warn(f"template '{self.block_rule}' ({self.family}) failed on {_name(func)}"
                          f"{' with ' + transferred if transferred else ''}; using {instead}: "
                          f"{text[-1] if text else type(err).__name__}")
            return None
        return sch

    def __call__(self, sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, target: tvm.target.Target,
                 knobs=None) -> None:
        """Schedule ``block`` of ``sch`` in place (tests, MetaSchedule's custom rule): knobs as in :meth:`Knobs.of`."""
        self.schedule(sch, block, target, self.Knobs.of(knobs) if knobs is not None else self.knobs)

    # -- helpers --------------------------------------------------------------------------------------
    def find_block(self, sch: s_tir.Schedule) -> Optional[s_tir.schedule.SBlockRV]:
        """The root-level block annotated with this template's ``block_rule``, if any."""
        for block in root_blocks(sch):
            rule = sch.get(block).annotations.get("schedule_rule")
            if rule is not None and str(rule) == self.block_rule:
                return block
        return None


def root_blocks(sch: s_tir.Schedule) -> list:
    """The blocks directly under the root block; none for a PrimFunc without one (an extern call, a
    hand-written kernel): templates and fallbacks must skip those, not fail on them."""
    try:
        return list(sch.get_child_blocks(sch.get_sblock("root")))
    except Exception:  # noqa: BLE001  (ScheduleError, or a TVM error for a function without blocks)
        return []


def block_rule_of(func: tirx.PrimFunc) -> Optional[str]:
    """The ``schedule_rule`` annotation of a root-level block of ``func`` naming one of our templates."""
    stack = [func.body]
    while stack:
        node = stack.pop()
        if isinstance(node, s_tir.SBlock):
            rule = node.annotations.get("schedule_rule")
            if rule is not None and str(rule) != "None":
                return str(rule)
        for name in ("body", "block", "then_case", "else_case"):
            child = getattr(node, name, None)
            if isinstance(child, tirx.Stmt):
                stack.append(child)
        stack.extend(getattr(node, "seq", None) or [])
    return None


def _name(func: tirx.PrimFunc) -> str:
    attrs: Dict = func.attrs or {}
    return str(attrs.get("global_symbol", attrs.get("tfx.op", "a kernel")))


def symbolic_extent_reason(sch: s_tir.Schedule) -> Optional[str]:
    """Why a template written for static shapes cannot take this kernel: a loop of symbolic extent."""
    for block in root_blocks(sch):
        for loop in sch.get_loops(block):
            extent = sch.get(loop).extent
            if not isinstance(extent, tirx.IntImm):
                return f"loop extent {extent} is symbolic"
    return None
