"""The tuning driver: tasks of ``compile.prepare``'s lowered module → MetaSchedule (templates | auto sketches) →
JSON database.

One run::

    Relax model ─ SemanticFusion ─ compile.prepare ─ extract_tasks ─┬─ skip light tasks (reshape, elementwise)
                                                                    └─ per task, a design space (spaces.py):
         "template": our template's knobs (ApplyCustomRule only, minimal postprocs)
         "auto":     MetaSchedule's generated sketches (default rules); where they cannot be generated
                     (MultiLevelTiling crashes on the attention kernel on llvm) the task falls back to its
                     template, and a task without a template uses "auto" in either mode
    + expert hard rules (postproc, before building) ─ cost model (rank_model.py, handover_model.py, XGBModel
    or RandomModel) ─ EvolutionarySearch ─ "gradient" | "round-robin" task scheduler ─
    tuning_logs/<workload>-<target>/ (see ``records.py``)

The cost model starts from the records already measured when there are any: the directory's own on a
resume, and ``--warm-start`` directories (``warm_start.py``).

Tasks (``tasks.py``) come from the same lowering the build runs, so ``build(mod, target, logs=dir)`` finds
every record again. Design spaces are generated once, before tuning, and handed to MetaSchedule as a fixed
space: that is how one run mixes template and auto tasks.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import tvm

from ..errors import FusionExtError
from .. import records
from ..targets import TargetInfo, resolve_target
from .intrin_stub import skip_tensor_intrin, stub_tensor_intrinsics
from .spaces import (SPACES, choose_space, fixed_space_class, mutators, postprocs, register_custom_rules,
                     replay)
from .task_logs import task_loggers
from .tasks import DEFAULT_MIN_FLOPS, Task, estimate_flops, extract_tasks, light_reason

# The names above stay importable from the driver (``tune.driver.extract_tasks`` etc.), as before the split.
__all__ = ["SPACES", "SCHEDULERS", "COST_MODELS", "DEFAULT_MIN_FLOPS", "Task", "TuneOptions", "choose_space",
           "estimate_flops", "extract_tasks", "light_reason", "measure_template_defaults", "register_custom_rules",
           "replay", "skip_tensor_intrin", "stub_tensor_intrinsics", "tune"]

SCHEDULERS = ("gradient", "round-robin")
COST_MODELS = ("auto", "rank", "handover", "xgb", "random")


# ----------------------------------------------------------------------------------------------- the run

@dataclass
class TuneOptions:
    trials: int = 64                          # total measured trials wanted in the record directory
    space: str = "template"
    scheduler: str = "gradient"
    per_iter: int = 8                         # candidates measured per task per round
    population: int = 64                      # evolutionary-search population
    min_flops: float = DEFAULT_MIN_FLOPS
    builder_workers: int = 1
    builder_timeout: float = 60.0
    runner: object = None                     # a MetaSchedule Runner; None: LocalRunner on this machine
    seed: int = 1
    cost_model: str = "auto"                  # "auto": "handover" with --warm-start (the replay's winner, which
    #                                           transfers), else "rank"; "rank": RankModel (rank_model.py);
    #                                           "handover": rank, then XGBModel (handover_model.py); "xgb":
    #                                           MetaSchedule's XGBModel; "random": RandomModel (baseline)
    fast_import: Optional[bool] = None        # stub the tensor-intrinsic registry (default: llvm only)
    warm_start: Tuple[str, ...] = ()          # record dirs (or roots) whose records pre-train XGBModel
    progress: Optional[Callable[[str], None]] = print


def _check_options(opts: TuneOptions) -> None:
    if opts.space not in SPACES:
        raise FusionExtError(f"unknown search space '{opts.space}' (use {' or '.join(SPACES)})")
    if opts.scheduler not in SCHEDULERS:
        raise FusionExtError(f"unknown task scheduler '{opts.scheduler}' (use {' or '.join(SCHEDULERS)})")
    if opts.cost_model not in COST_MODELS:
        raise FusionExtError(f"unknown cost model '{opts.cost_model}' (use {' or '.join(COST_MODELS)})")
    if opts.trials < 0:
        raise FusionExtError(f"--trials must be >= 0, got {opts.trials}")
    if opts.warm_start and opts.cost_model == "random":
        raise FusionExtError("--warm-start trains a cost model: it needs --cost-model rank, handover or xgb")


def tune(mod: tvm.IRModule, target=None, logs: str = "tuning_logs", workload: str = "model",
         options: Optional[TuneOptions] = None, fuse: bool = True, precision: str = "fp32") -> dict:
    """Tune ``mod`` (a Relax module as imported, unfused when ``fuse``) into ``<logs>/<workload>-<target>/``.

    ``options.trials`` is the total for that directory: a rerun after an interruption measures only what is
    missing and keeps every record already written. Returns the manifest (also written to the directory).
    ``precision``: the dense kernels' precision (``bf16``/``int8`` kernels are other workloads than fp32 ones:
    their records go to ``<workload>-<precision>-<target>/``)."""
    from ..compile import prepare
    from ..compile.precision import check_precision

    precision = check_precision(precision)
    require_static_inputs(mod, f"'{workload}'")
    if precision != "fp32":
        workload = f"{workload}-{precision}"
    opts = options or TuneOptions()
    _check_options(opts)
    auto = opts.cost_model == "auto"
    if auto:
        # the replay's winner hands a kernel over from the ranker to XGBModel, both pre-trained on other models'
        # records; without such records the ranker alone (docs/tuning.md, "Replay")
        opts = dataclasses.replace(opts, cost_model="handover" if opts.warm_start else "rank")
    target = resolve_target(target)
    from .warm_start import record_dirs

    warm_dirs = [d for src in opts.warm_start for d in record_dirs(src)]  # bad paths fail before any work
    say = opts.progress or (lambda _msg: None)
    mhash = records.with_precision(records.model_hash(mod), precision)
    out = logs if records.is_record_dir(logs) else records.record_dir(logs, workload, target)
    previous = records.read_manifest(out)
    if previous is not None and not records.matches(previous, mhash, target):
        raise records.TuningLogError(f"'{out}' holds records for another model or target "
                                   f"({previous.get('model_hash')} on {previous.get('target')})")
    if previous is not None and int(previous.get("trials", 0)) >= opts.trials:
        say(f"tune: nothing to do ({previous.get('trials')} trials already in {out})")
        return previous
    info = TargetInfo.of(target)
    if info.is_cuda:
        os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")  # inherited by builder workers
    fast = opts.fast_import if opts.fast_import is not None else info.is_cpu
    with stub_tensor_intrinsics(fast):
        lowered, _ = prepare(mod, target, fuse_graph=fuse, precision=precision)
        return _tune(lowered, target, out, workload, mhash, previous, opts, fast, say, warm_dirs, auto)


def require_static_inputs(mod: tvm.IRModule, label: str) -> None:
    """Tuning times every candidate at one size, so a model whose inputs have dynamic dims is refused with the
    way to pin them (MetaSchedule's search would stop at the first symbolic loop with an internal error)."""
    from ..frontend.dims import dynamic_inputs, pinning_example

    dynamic = dynamic_inputs(mod)
    if dynamic:
        listed = ", ".join(f"{n}[{','.join(str(d) for d in dims)}]" for n, dims in list(dynamic.items())[:4])
        raise FusionExtError(f"{label} has dynamic input dims ({listed}): tuning times kernels at one size, "
                             f"so pin them with --shape (shapes= in load_onnx), e.g. --shape "
                             f"{pinning_example(dynamic)}; the records serve the dynamic build too")


def _tune(lowered, target, out, workload, mhash, previous, opts: TuneOptions, fast: bool, say,
          warm_dirs: List[str], auto: bool = False) -> dict:
    """``auto``: the cost model was the default's choice, not the user's (it may fall back, below)."""
    from tvm.s_tir import meta_schedule as ms

    from ..schedules.registry import prepare_for_records

    register_custom_rules()
    prepare_for_records(target)  # a resumed run reads its records' traces
    database = records.open_database(out, create=True)
    tasks, skipped = extract_tasks(lowered, target, opts.min_flops)
    tunable = [t for t in tasks if choose_space(t, target, opts.space, opts.seed)]
    unusable = [(t.name, t.note or "no design space") for t in tasks if t not in tunable]

    from .progress import Progress

    done_before = int((previous or {}).get("trials", 0))
    budget = max(0, opts.trials - done_before)
    progress = Progress(out, tunable, database, target, budget, say,
                        base=_manifest_base(workload, mhash, target, opts, skipped + unusable, previous))
    progress.write()
    if budget == 0 or not tunable:
        say(f"tune: nothing to do ({done_before} trials already in {out}, {len(tunable)} tasks)")
        return progress.finish()
    say(f"tune: {len(tunable)} tasks ({', '.join(f'{t.name}[{t.space}]' for t in tunable)}), "
        f"{len(skipped) + len(unusable)} skipped, {budget} trials -> {out}")

    if opts.cost_model == "random":
        # MetaSchedule's baseline: random scores, so evolutionary search picks candidates blindly
        cost_model = ms.cost_model.RandomModel(seed=opts.seed)
        progress.cost_model = None  # its scores are not predictions: no rank correlation
    else:
        warmup = min(8, max(2, opts.per_iter))
        if opts.cost_model in ("rank", "handover"):
            from .rank_model import RankModel

            ranker = cost_model = RankModel(target, num_warmup_samples=warmup, seed=opts.seed)
            if opts.cost_model == "handover":
                from .handover_model import HandoverModel

                cost_model = HandoverModel(ranker, ms.cost_model.XGBModel(num_warmup_samples=warmup))
        else:
            cost_model = ms.cost_model.XGBModel(num_warmup_samples=warmup)
        progress.cost_model = cost_model
        transferred = _warm_start(cost_model, out, done_before, warm_dirs, target, progress, say)
        if auto and opts.cost_model == "handover" and not transferred:
            # the handover was measured only with transfer: with none of the other records usable here (another
            # CPU's), the default is what it is without --warm-start (the ranker keeps what it learned)
            say("tune: no --warm-start record is for this target, so the ranker alone picks (--cost-model rank)")
            opts = dataclasses.replace(opts, cost_model="rank")
            progress.base["cost_model"] = "rank"
            progress.cost_model = cost_model = ranker
    with task_loggers(out, [t.name for t in tunable]) as loggers:
        return _search(tunable, loggers, target, out, database, opts, fast, progress, cost_model, budget, say)


def _search(tunable, loggers, target, out, database, opts, fast, progress, cost_model, budget, say):
    from tvm.s_tir import meta_schedule as ms

    FixedSpace = fixed_space_class()
    contexts = []
    for task, logger, rand in zip(tunable, loggers, ms.utils.fork_seed(opts.seed, n=len(tunable))):
        space = FixedSpace(task.spaces, postprocs(target, task.space, task.stats), mutators(target, task.space))
        strategy = ms.search_strategy.EvolutionarySearch(population_size=opts.population, genetic_num_iters=2,
                                                         init_min_unmeasured=min(50, opts.population))
        contexts.append(ms.TuneContext(mod=task.mod, target=target, space_generator=space,
                                       search_strategy=strategy, task_name=task.name, logger=logger,
                                       rand_state=rand, num_threads=max(1, min(2, os.cpu_count() or 1))))
    progress.contexts = contexts
    builder = ms.builder.LocalBuilder(max_workers=opts.builder_workers, timeout_sec=opts.builder_timeout,
                                      initializer=skip_tensor_intrin if fast else None)
    if opts.runner is None and TargetInfo.of(target).is_cpu:
        from ..deploy.threads import configure_cpu_threads

        # measure with the thread count the build will run with (TVM defaults to 1 thread on 2 vCPUs)
        configure_cpu_threads(TargetInfo.of(target).cores)
    # repeats of >= 20 ms each: a single short repeat on a busy 2-core machine records noise as speed
    runner = opts.runner or ms.runner.LocalRunner(evaluator_config=ms.runner.EvaluatorConfig(
        number=3, repeat=3, min_repeat_ms=20, enable_cpu_cache_flush=False))
    start = time.time()
    budget -= measure_template_defaults(contexts, tunable, target, database, builder, runner, progress, budget)
    if budget <= 0:
        manifest = progress.finish(seconds=time.time() - start)
        say(f"tune: done, {manifest['trials']} trials in {out}")
        return manifest
    ms.tune_tasks(tasks=contexts, task_weights=[float(t.weight) for t in tunable], work_dir=out,
                  max_trials_global=budget, num_trials_per_iter=opts.per_iter, builder=builder, runner=runner,
                  database=database, cost_model=cost_model,
                  measure_callbacks=[ms.measure_callback.AddToDatabase(), ms.measure_callback.RemoveBuildArtifact(),
                                     progress.callback(), ms.measure_callback.UpdateCostModel()],
                  task_scheduler=opts.scheduler)
    manifest = progress.finish(seconds=time.time() - start)
    failed = sum(int(t.get("failed", 0)) for t in manifest.get("tasks", {}).values())
    say(f"tune: done, {manifest['trials']} trials in {out}"
        + (f" ({failed} candidates failed to build or run; see the per-batch lines above)" if failed else ""))
    return manifest


def _warm_start(cost_model, out, done_before, warm_dirs, target, progress, say) -> int:
    """Pre-train the cost model on this directory's records (a resumed run) and on ``--warm-start`` directories;
    returns how many of the latter's records were for this target."""
    from .warm_start import warm_start

    own = os.path.realpath(out)
    others = [d for d in dict.fromkeys(warm_dirs) if os.path.realpath(d) != own]
    sources = ([out] if done_before else []) + others
    if not sources:
        return 0
    stats = warm_start(cost_model, sources, target)
    progress.base["warm_start"] = stats.to_dict()
    skipped = stats.other_target + stats.unreplayable
    say(f"tune: cost model warm-started on {stats.records} records of {stats.workloads} kernels from "
        f"{len(sources)} directories" + (f" ({skipped} records skipped: other target or stale trace)"
                                        if skipped else ""))
    return sum(stats.by_source.get(d, 0) for d in others)


def measure_template_defaults(contexts, tasks, target, database, builder, runner, progress, budget: int) -> int:
    """Measure each template task's expert-default schedule first and record it like any other trial.

    The evolutionary search samples fresh decisions and never measures the template's own defaults, so without
    this a noisy record slower than the defaults could win at build time. With the defaults in the database,
    the applied record is never worse than them as far as measurement can tell. Tasks that already have
    records (a resumed run) are skipped. Returns the number of trials spent."""
    from tvm.s_tir import meta_schedule as ms

    picked = []
    for i, (ctx, task) in enumerate(zip(contexts, tasks)):
        if len(picked) >= budget:
            break
        if task.space != "template" or not task.spaces or progress.state[task.name]["trials"] > 0:
            continue
        sch = replay(task.mod, task.spaces[0])
        if not all(p.apply(sch) for p in ctx.space_generator.postprocs):
            continue  # the defaults break a postproc's rule for this shape: let the search find valid knobs
        args = ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
        picked.append((i, task, ms.MeasureCandidate(sch, args)))
    if not picked:
        return 0
    builds = builder.build([ms.builder.BuilderInput(c.sch.mod, target) for _, _, c in picked])
    device = "cuda" if TargetInfo.of(target).is_cuda else "cpu"
    inputs = [ms.runner.RunnerInput(b.artifact_path, device, c.args_info)
              for (_, _, c), b in zip(picked, builds) if b.error_msg is None]
    results = iter([f.result() for f in runner.run(inputs)])
    for (i, task, cand), b in zip(picked, builds):
        res = next(results) if b.error_msg is None else ms.runner.RunnerResult(None, b.error_msg)
        if res.error_msg is None:
            workload = database.commit_workload(task.mod)
            database.commit_tuning_record(ms.database.TuningRecord(cand.sch.trace, workload, res.run_secs, target,
                                                                   cand.args_info))
        progress.record(i, [cand], [res], [b])
    return len(picked)


def _manifest_base(workload, mhash, target, opts: TuneOptions, skipped, previous) -> dict:
    base = dict(previous or {})
    base.update({"workload": workload, "model_hash": mhash, "target": records.target_label(target),
                 "target_spec": str(target), "space": opts.space, "scheduler": opts.scheduler,
                 "cost_model": opts.cost_model,
                 "skipped": {name: why for name, why in skipped}})
    return base
