"""``tvm-fusion tune MODEL.onnx ...``: tuning with MetaSchedule (:mod:`tvm_fusion_ext.tune`)."""

from __future__ import annotations

import os


def cmd_tune(args) -> int:
    from ..compile.precision import check_precision
    from ..frontend import load_onnx, parse_shape_arg
    from ..tune.driver import TuneOptions, tune

    precision = check_precision(args.precision)  # before the model loads
    from ..tune.remote import make_runner

    if args.trials < 0:
        from ..errors import FusionExtError

        raise FusionExtError(f"--trials must be >= 0, got {args.trials}")
    shapes = parse_shape_arg(args.shape) if getattr(args, "shape", None) else None
    mod = load_onnx(args.model, shapes=shapes)
    runner = None
    if args.rpc or args.key:
        if not args.rpc:
            from ..errors import FusionExtError

            raise FusionExtError("--key needs --rpc HOST:PORT (the RPC tracker)")
        runner = make_runner(args.rpc, args.key)
    if args.build_only is not None:
        return _build_only(mod, args)
    workload = os.path.splitext(os.path.basename(args.model))[0]
    opts = TuneOptions(trials=args.trials, space=args.space, scheduler=args.scheduler, runner=runner,
                       per_iter=args.per_iter, population=args.population, cost_model=args.cost_model,
                       seed=args.seed, warm_start=tuple(args.warm_start or ()))
    manifest = tune(mod, args.target, logs=args.logs, workload=workload, options=opts, fuse=not args.no_fusion,
                    precision=precision)
    for name, task in sorted(manifest.get("tasks", {}).items()):
        best = task.get("best_us")
        q = task.get("quality") or {}
        print(f"  {name:<40} {task.get('space', ''):<8} trials {task.get('trials', 0):>4}  best "
              f"{'-' if best is None else f'{best:.2f} us'}  spearman {q.get('spearman')}  "
              f"to-5% {q.get('trials_to_5pct')}  expert-rejected "
              f"{(task.get('expert_rules') or {}).get('rejected_total', 0)}")
    return 0


def _build_only(mod, args) -> int:
    import json

    from ..compile.precision import check_precision
    from ..errors import FusionExtError
    from ..tune.check_candidates import check_candidates

    if args.build_only < 1:
        raise FusionExtError(f"--build-only needs a number of candidates per task >= 1, got {args.build_only}")
    if args.rpc:
        raise FusionExtError("--build-only measures nothing: drop --rpc")
    report = check_candidates(mod, args.target, per_task=args.build_only, space=args.space, seed=args.seed,
                              fuse=not args.no_fusion, precision=check_precision(args.precision))
    tasks = report["tasks"].values()
    built = sum(t["built"] for t in tasks)
    rejected = sum(t["expert_rules"]["rejected_total"] for t in tasks)
    print(f"build-only: {len(report['tasks'])} tasks, {built} candidates built for {report['target']}, "
          f"{rejected} rejected by expert rules before building, "
          f"{sum(t['build_errors'] for t in tasks)} build errors")
    if args.json:
        print(json.dumps(report, indent=2))
    broken = [name for name, t in report["tasks"].items() if t["built"] == 0]
    if broken:
        raise FusionExtError(f"no candidate of task(s) {', '.join(broken)} built for {report['target']}: "
                             f"{report['tasks'][broken[0]]['first_error']}")
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("tune", help="tune the model's fused kernels with MetaSchedule into a log directory")
    p.add_argument("model", help="ONNX model file")
    p.add_argument("--shape", help="static input shapes for dynamic dims, e.g. input_ids:1x128")
    p.add_argument("--target", default="llvm", help="llvm (default), cuda or cuda:sm_80 / cuda:sm_90")
    p.add_argument("--trials", type=int, default=64,
                   help="total measured trials for the record directory (a rerun resumes up to this number)")
    p.add_argument("--logs", default="tuning_logs",
                   help="root of tuning-log directories (records go to LOGS/<model>-<target>/)")
    p.add_argument("--space", choices=("template", "auto"), default="template",
                   help="template: our templates' knobs; auto: MetaSchedule's sketches (template where they fail)")
    p.add_argument("--scheduler", choices=("gradient", "round-robin"), default="gradient", help="task scheduler")
    p.add_argument("--cost-model", choices=("auto", "rank", "handover", "xgb", "random"), default="auto",
                   help="auto (default): handover with --warm-start, else rank; rank: our pairwise-ranking XGBoost "
                        "on each candidate's decisions and expert features (tune/rank_model.py); handover: rank for "
                        "a kernel's first 64 trials, then MetaSchedule's XGBModel, both warm-started "
                        "(tune/handover_model.py; the replay benchmark's winner); xgb: MetaSchedule's XGBModel; "
                        "random: random scores (baseline for comparison)")
    p.add_argument("--seed", type=int, default=1, help="random seed of the search")
    p.add_argument("--warm-start", action="append", metavar="DIR",
                   help="pre-train the cost model on the records in DIR (a record directory or a root of "
                        "them, e.g. another model's logs for this target); repeatable. A resumed run always "
                        "pre-trains on its own records")
    p.add_argument("--rpc", metavar="HOST:PORT", help="measure through this TVM RPC tracker")
    p.add_argument("--key", help="RPC device key (with --rpc)")
    p.add_argument("--per-iter", type=int, default=8, help="candidates measured per task per round")
    p.add_argument("--population", type=int, default=64, help="evolutionary-search population size")
    p.add_argument("--no-fusion", action="store_true", help="tune the model without the fusion passes")
    p.add_argument("--build-only", type=int, metavar="N",
                   help="measure nothing: build N candidates per task for the target (e.g. a GPU that is not "
                        "here) through the expert rules and report what was rejected and what compiled")
    p.add_argument("--json", action="store_true", help="with --build-only: print the per-task report as JSON")
    p.add_argument("--precision", help="what the dense kernels compute in: fp32 | bf16 | int8 (default fp32); "
                                       "records of a bf16/int8 build go to <model>-<precision>-<target>/ and serve "
                                       "builds of that precision")
    p.set_defaults(func=cmd_tune)
