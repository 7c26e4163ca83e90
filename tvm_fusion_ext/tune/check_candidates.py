"""Build tuning candidates for a target without measuring them: ``tvm-fusion tune ... --build-only N``.

For a GPU that is not on this machine (or not bought yet): the same tasks and design spaces as a tuning run,
``N`` candidates per task sampled with random decisions (MetaSchedule's ``ReplayTrace``), the expert hard rules
applied as postprocessors (what they reject is never built), and every surviving candidate compiled with
the target's toolchain (nvcc for CUDA). Nothing is measured and nothing is written to a database.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import tvm

from .intrin_stub import skip_tensor_intrin, stub_tensor_intrinsics
from .spaces import choose_space, fixed_space_class, mutators, one_line, postprocs, register_custom_rules
from .tasks import DEFAULT_MIN_FLOPS, extract_tasks


def check_candidates(mod: tvm.IRModule, target, per_task: int = 8, space: str = "template", seed: int = 1,
                     fuse: bool = True, min_flops: float = DEFAULT_MIN_FLOPS, only: Sequence[str] = (),
                     say: Optional[Callable[[str], None]] = print, precision: str = "fp32") -> dict:
    """Per task: candidates sampled, rejected by each expert rule, built, and the first build error.
    ``only``: check just the tasks whose names start with one of these."""
    import os

    from tvm.s_tir import meta_schedule as ms

    from ..compile import prepare
    from ..targets import TargetInfo, resolve_target

    from .driver import require_static_inputs

    require_static_inputs(mod, "the model")
    say = say or (lambda _m: None)
    target = resolve_target(target)
    info = TargetInfo.of(target)
    if info.is_cuda:
        os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")  # inherited by builder workers
    # TVM's own tensor intrinsics (~30 s to register) serve only MetaSchedule's generated CUDA sketches
    fast = info.is_cpu or space == "template"
    report = {"target": info.arch if info.is_cuda and info.arch else info.kind, "space": space, "tasks": {}}
    with stub_tensor_intrinsics(fast):
        lowered, _ = prepare(mod, target, fuse_graph=fuse, precision=precision)
        register_custom_rules()
        tasks, skipped = extract_tasks(lowered, target, min_flops)
        report["skipped"] = {name: why for name, why in skipped}
        FixedSpace = fixed_space_class()
        builder = ms.builder.LocalBuilder(max_workers=1, timeout_sec=300,
                                          initializer=skip_tensor_intrin if fast else None)
        for task in tasks:
            if only and not task.name.startswith(tuple(only)):
                continue
            if not choose_space(task, target, space, seed):
                report["skipped"][task.name] = task.note or "no design space"
                continue
            ctx = ms.TuneContext(mod=task.mod, target=target,
                                 space_generator=FixedSpace(task.spaces, postprocs(target, task.space, task.stats),
                                                            mutators(target, task.space)),
                                 search_strategy=ms.search_strategy.ReplayTrace(), task_name=task.name,
                                 rand_state=seed, num_threads=1)
            ctx.pre_tuning(max_trials=per_task, num_trials_per_iter=per_task)
            candidates = ctx.generate_measure_candidates() or []
            ctx.post_tuning()
            results = builder.build([ms.builder.BuilderInput(c.sch.mod, target) for c in candidates])
            errors = [r.error_msg for r in results if r.error_msg is not None]
            stats = task.stats.to_dict()
            report["tasks"][task.name] = {
                "space": task.space, "candidates": len(candidates), "built": len(results) - len(errors),
                "build_errors": len(errors), "first_error": one_line(RuntimeError(errors[0])) if errors else None,
                "expert_rules": stats,
            }
            say(f"  {task.name:<40} {task.space:<8} sampled {stats['checked']:>4}  rejected by expert rules "
                f"{stats['rejected_total']:>4}  built {len(results) - len(errors)}/{len(candidates)}")
    return report
