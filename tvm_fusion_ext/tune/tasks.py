"""Tuning tasks: the kernels of a lowered Relax module (``compile.prepare``) that are worth trials.

MetaSchedule's ``extract_tasks`` gives one task per distinct kernel; reshapes, pure elementwise and tiny
kernels are skipped with a reason, and a task remembers its template's ``schedule_rule`` (None without one).
Because tasks come from the same lowering the build runs, ``build(mod, target, logs=dir)`` finds every
record again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import tvm

from .expert import RuleStats

# Below this many FLOPs a kernel costs less than a launch / the VM call around it: not worth a trial.
DEFAULT_MIN_FLOPS = 1000.0
#: templates of memory-bound row passes whose only knob (unrolling) moves nothing measurable: their trials would
#: come out of the dense kernels' budget
UNTUNED_RULES = {"tfx.quantize_rows": "a memory-bound pass over rows (int8's row quantization); template defaults"}


@dataclass
class Task:
    name: str
    weight: int
    mod: tvm.IRModule
    flops: Optional[float]           # None where MetaSchedule cannot count them
    rule: Optional[str]              # the template's schedule_rule, None without one
    space: str = ""                  # "template" | "auto", after probing
    note: str = ""                   # why the space differs from the one asked for
    spaces: list = field(default_factory=list)
    stats: RuleStats = field(default_factory=RuleStats)


def _blocks(func):
    from .expert import child_stmts

    stack = [func.body]
    while stack:
        node = stack.pop()
        if type(node).__name__ == "SBlock":
            yield node
        stack.extend(child_stmts(node))


def _template_rule(func, target) -> Optional[str]:
    from ..schedules.registry import get_template
    from ..schedules.rule import block_rule_of

    rule = block_rule_of(func)
    return rule if rule is not None and get_template(rule, target) is not None else None


def light_reason(func, has_template: bool, min_flops: float = DEFAULT_MIN_FLOPS) -> Optional[str]:
    """Why a task is not worth trials (None if it is): reshapes become views, pure elementwise/copy kernels
    are memory-bound and the fallback schedule already streams them, tiny kernels cost less than a call."""
    from tvm import relax

    if relax.analysis.has_reshape_pattern(func):
        return "reshape"
    if has_template:
        return None
    if not any(int(iv.iter_type) == tvm.tirx.IterVar.CommReduce for blk in _blocks(func) for iv in blk.iter_vars):
        return "elementwise"
    flops = estimate_flops(tvm.IRModule({"main": func}))
    if flops is not None and flops < min_flops:
        return "light"
    return None


def estimate_flops(mod: tvm.IRModule) -> Optional[float]:
    """MetaSchedule's FLOP estimate, None where it cannot count (it refuses e.g. ``Let`` expressions)."""
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        return float(estimate_tir_flops(mod))
    except Exception:  # noqa: BLE001
        return None


def extract_tasks(lowered: tvm.IRModule, target, min_flops: float = DEFAULT_MIN_FLOPS
                  ) -> Tuple[List[Task], List[Tuple[str, str]]]:
    """Tuning tasks of a lowered module (``compile.prepare``): ``(tasks, [(skipped task, reason), ...])``."""
    from tvm.s_tir import meta_schedule as ms

    tasks, skipped = [], []
    for ext in ms.relax_integration.extract_tasks(lowered, target):
        mod = ext.dispatched[0]
        func = mod["main"]
        rule = _template_rule(func, target)
        reason = UNTUNED_RULES.get(rule) or light_reason(func, rule is not None, min_flops)
        if reason is None and estimate_flops(mod) is None:
            # MetaSchedule's task scheduler estimates every task's FLOPs and aborts the whole run where it
            # cannot (e.g. a Let expression, as in fused_attention's fast exp): leave it to its template.
            reason = "MetaSchedule cannot estimate its FLOPs (Let expression); built with template defaults"
        if reason:
            skipped.append((ext.task_name, reason))
            continue
        tasks.append(Task(ext.task_name, int(ext.weight), mod, estimate_flops(mod), rule))
    return tasks, skipped

