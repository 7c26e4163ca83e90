"""XGBoost-guided search against random search on the same tasks and budget (a benchmark, not a test).

``python -m tvm_fusion_ext.tune.compare MODEL.onnx --space auto --trials 96 --seeds 1,2,3``, or
``--dense 128x384x1536`` instead of a model: one FFN projection (MatMul + bias + GELU), a single heavy task.

For each seed it tunes the model twice from scratch, once with MetaSchedule's ``XGBModel`` and once with its
``RandomModel`` (evolutionary search that picks candidates blindly), each into its own directory under
``--logs``, then reads the measured latencies per task in measurement order from the JSON record files and
prints, per task and seed:

* ``to 5% (own)``: trials until the running best is within 5 % of that run's final best (the issue's
  measure; it rewards a run that stops improving early, good or bad);
* ``to 5% (common)``: trials until a run is within 5 % of the better of the two final bests (a shared bar:
  a run that never gets there counts as its budget + 1);
* the final bests.

The last line gives the medians over seeds and their ratio (XGBoost / random).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Optional


def latencies_by_task(record_dir: str) -> Dict[str, List[Optional[float]]]:
    """Mean measured seconds per record (None for a failure), in the order the records were written."""
    from ..records import FAILED_RUN_SECS, RECORD_FILE

    # tasks are named by their workload's line in the database; a single tuned task by its manifest name
    with open(os.path.join(record_dir, "manifest.json")) as f:
        tuned = [n for n, t in json.load(f).get("tasks", {}).items() if t.get("trials")]
    out: Dict[str, List[Optional[float]]] = {}
    with open(os.path.join(record_dir, RECORD_FILE)) as f:
        for line in f:
            if not line.strip():
                continue
            idx, rec = json.loads(line)
            secs = rec[1]
            ok = secs and all(s is not None and 0 < float(s) < FAILED_RUN_SECS for s in secs)
            out.setdefault(f"workload{idx}", []).append(sum(map(float, secs)) / len(secs) if ok else None)
    if len(out) == len(tuned) == 1:
        return {tuned[0]: next(iter(out.values()))}
    return out


def trials_to_within(history: List[Optional[float]], bar: float) -> Optional[int]:
    """1-based trial at which the running best first gets to ``bar`` or below."""
    best = float("inf")
    for i, t in enumerate(history, 1):
        if t is not None:
            best = min(best, t)
        if best <= bar:
            return i
    return None


def _best(history: List[Optional[float]]) -> Optional[float]:
    ok = [t for t in history if t is not None]
    return min(ok) if ok else None


def compare(model, space: str, trials: int, seeds: List[int], logs: str, target: str = "llvm",
            per_iter: int = 8, say=print, warm_start: tuple = (), population: int = 64) -> List[dict]:
    from ..frontend import load_onnx
    from .driver import TuneOptions, tune

    mod = load_onnx(model) if isinstance(model, str) else model
    rows = []
    for seed in seeds:
        runs = {}
        for cost_model in ("xgb", "random"):
            root = os.path.join(logs, f"{cost_model}-seed{seed}")
            opts = TuneOptions(trials=trials, space=space, cost_model=cost_model, seed=seed, per_iter=per_iter,
                               population=population, warm_start=warm_start if cost_model == "xgb" else ())
            manifest = tune(mod, target, logs=root, workload="compare", options=opts)
            (sub,) = [d for d in os.listdir(root) if d.startswith("compare-")]
            runs[cost_model] = latencies_by_task(os.path.join(root, sub))
            say(f"seed {seed} {cost_model}: {manifest['trials']} trials")
        for task in sorted(runs["xgb"]):
            hx, hr = runs["xgb"][task], runs["random"].get(task, [])
            bx, br = _best(hx), _best(hr)
            common = min(b for b in (bx, br) if b is not None) * 1.05
            rows.append({
                "seed": seed, "task": task,
                "xgb_own": trials_to_within(hx, bx * 1.05) if bx else None,
                "random_own": trials_to_within(hr, br * 1.05) if br else None,
                "xgb_common": trials_to_within(hx, common) or len(hx) + 1,
                "random_common": trials_to_within(hr, common) or len(hr) + 1,
                "xgb_best_us": None if bx is None else bx * 1e6,
                "random_best_us": None if br is None else br * 1e6,
            })
    return rows


def format_rows(rows: List[dict]) -> str:
    import numpy as np

    lines = [f"{'seed':>4}  {'task':<28} {'to 5% own xgb/random':>22} {'to 5% common xgb/random':>25} "
             f"{'best us xgb/random':>22}"]
    for r in rows:
        lines.append(f"{r['seed']:>4}  {r['task'][:28]:<28} {r['xgb_own']!s:>10} / {r['random_own']!s:<9} "
                     f"{r['xgb_common']!s:>12} / {r['random_common']!s:<10} "
                     f"{r['xgb_best_us'] or 0:>10.1f} / {r['random_best_us'] or 0:<9.1f}")
    for key in ("own", "common"):
        x = [r[f"xgb_{key}"] for r in rows if r[f"xgb_{key}"]]
        y = [r[f"random_{key}"] for r in rows if r[f"random_{key}"]]
        if x and y:
            mx, my = float(np.median(x)), float(np.median(y))
            lines.append(f"median trials to 5% ({key}): xgb {mx:g}, random {my:g}, ratio {mx / my:.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tvm_fusion_ext.tune.compare", description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", help="ONNX model (or use --dense)")
    p.add_argument("--dense", metavar="MxKxN", help="compare on one fused_dense+GELU of this shape instead")
    p.add_argument("--space", choices=("template", "auto"), default="auto")
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--per-iter", type=int, default=8)
    p.add_argument("--population", type=int, default=64, help="evolutionary-search population (both runs)")
    p.add_argument("--target", default="llvm")
    p.add_argument("--logs", default="compare_logs", help="a fresh directory for the runs' records")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--warm-start", action="append", metavar="DIR",
                   help="pre-train the XGBoost run's cost model on these records (random search cannot use them)")
    args = p.parse_args(argv)
    if (args.model is None) == (args.dense is None):
        p.error("give a MODEL.onnx or --dense MxKxN")
    model = args.model
    if args.dense:
        from ..frontend import load_onnx
        from ..models import build_dense_onnx

        try:
            m, k, n = (int(d) for d in args.dense.lower().split("x"))
        except ValueError:
            p.error(f"--dense takes MxKxN, e.g. 128x384x1536 (got '{args.dense}')")
        model = load_onnx(build_dense_onnx(m, k, n))
    rows = compare(model, args.space, args.trials, [int(s) for s in args.seeds.split(",")], args.logs,
                   args.target, args.per_iter, say=lambda m: print(m, file=sys.stderr),
                   warm_start=tuple(args.warm_start or ()), population=args.population)
    print(format_rows(rows))
    if args.json:
        from ..fileio import atomic_write

        atomic_write(args.json, lambda f: f.write(json.dumps(rows, indent=2)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
