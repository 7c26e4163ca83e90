"""Schedule templates: one function per (operator rule, target family), shared by building and tuning.

A template has the dlight-like signature ``template(sch, block, target, knobs=None) -> None``: it schedules
the PrimFunc in ``sch`` whose main block is ``block`` (the one annotated ``schedule_rule=<rule>``). Every
tunable choice is a MetaSchedule random variable (``sch.sample_perfect_tile`` / ``sch.sample_categorical``)
whose ``decision`` comes from ``knobs`` when given, else from the template's own expert default for the
shapes and target at hand. So one body serves three uses:

* the build path without tuning records (expert defaults, no search),
* MetaSchedule's ``ApplyCustomRule`` (the recorded trace holds the samples; the search mutates them),
* explicit knobs from a user or a test.

Rules must not branch on knob values (MetaSchedule replays the trace with other decisions) and must read
hardware limits from ``target`` rather than constants.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import tvm

Template = Callable[..., None]

_TEMPLATES: Dict[Tuple[str, str], Template] = {}


def target_family(target: tvm.target.Target) -> str:
    """"cuda" for CUDA targets, "cpu" for llvm; anything else has no templates."""
    keys = set(str(k) for k in target.keys)
    if "cuda" in keys or "gpu" in keys:
        return "cuda"
    if "cpu" in keys:
        return "cpu"
    return str(target.kind.name)


def register_template(rule: str, family: str):
    """Register ``fn`` as the template for blocks annotated ``schedule_rule=rule`` on ``family`` targets."""

    def wrap(fn: Template) -> Template:
        _TEMPLATES[(rule, family)] = fn
        return fn

    return wrap


def get_template(rule: str, target: tvm.target.Target) -> Optional[Template]:
    _load_templates()
    return _TEMPLATES.get((rule, target_family(target)))


def registered() -> Dict[Tuple[str, str], Template]:
    _load_templates()
    return dict(_TEMPLATES)


def _load_templates():
    # Import side effect: each module registers its templates. Kept lazy so that importing the package does
    # not import schedule code (nor TVM's tensor intrinsics, which cost ~30 s).
    import importlib
    import pkgutil

    from . import cpu, cuda

    for pkg in (cpu, cuda):
        for info in pkgutil.iter_modules(pkg.__path__):
            importlib.import_module(f"{pkg.__name__}.{info.name}")
