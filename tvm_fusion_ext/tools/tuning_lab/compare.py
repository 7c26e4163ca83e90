"""Model-guided search against random search on the same tasks and budget (a benchmark, not a test).

``python -m tvm_fusion_ext.tools.tuning_lab compare MODEL.onnx --space auto --trials 96 --seeds 1,2,3
[--cost-model rank]``,
or ``--dense 128x384x1536`` instead of a model: one FFN projection (MatMul + bias + GELU), a single heavy task.

For each seed it tunes the model twice from scratch, once guided by a cost model (``--cost-model``: our
``rank`` model or MetaSchedule's ``xgb``) and once with MetaSchedule's ``RandomModel`` (evolutionary search
that picks candidates blindly), each into its own directory under ``--logs``, then reads the measured
latencies per task in measurement order from the JSON record files and prints, per task and seed:

* ``to random's best``: trials until the guided run's best is as fast as the random run's final best (the
  replay benchmark's measure, ``replay.py``; budget + 1 if never), and, for random, the trial at which
  it found that best;
* ``to 5% (own)``: trials until the running best is within 5 % of that run's final best (it rewards a run
  that stops improving early, good or bad);
* ``to 5% (common)``: trials until a run is within 5 % of the better of the two final bests (budget + 1 if
  never);
* the final bests.

The last lines give the medians over seeds and their ratio (guided / random).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Optional


def latencies_by_task(record_dir: str) -> Dict[str, List[Optional[float]]]:
    """Mean measured seconds per record (None for a failure), in the order the records were written."""
    from ...records import FAILED_RUN_SECS, RECORD_FILE

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
            per_iter: int = 8, say=print, warm_start: tuple = (), population: int = 64,
            cost_model: str = "rank") -> List[dict]:
    from ...frontend import load_onnx
    from ...tune.driver import TuneOptions, tune

    mod = load_onnx(model) if isinstance(model, str) else model
    rows = []
    for seed in seeds:
        runs = {}
        for kind, name in (("guided", cost_model), ("random", "random")):
            root = os.path.join(logs, f"{name}-seed{seed}")
            opts = TuneOptions(trials=trials, space=space, cost_model=name, seed=seed, per_iter=per_iter,
                               population=population, warm_start=warm_start if kind == "guided" else ())
            manifest = tune(mod, target, logs=root, workload="compare", options=opts)
            (sub,) = [d for d in os.listdir(root) if d.startswith("compare-")]
            runs[kind] = latencies_by_task(os.path.join(root, sub))
            say(f"seed {seed} {name}: {manifest['trials']} trials")
        for task in sorted(runs["guided"]):
            rows.append(compare_histories(runs["guided"][task], runs["random"].get(task, []), seed, task,
                                          cost_model))
    return rows


def compare_histories(hx: List[Optional[float]], hr: List[Optional[float]], seed: int, task: str,
                      cost_model: str) -> dict:
    """One task and seed: the guided run's history ``hx`` against the random run's ``hr`` (seconds)."""
    bx, br = _best(hx), _best(hr)
    common = min(b for b in (bx, br) if b is not None) * 1.05 if (bx or br) else None
    return {
        "seed": seed, "task": task, "cost_model": cost_model,
        "guided_to_random_best": (trials_to_within(hx, br) or len(hx) + 1) if br else None,
        "random_to_own_best": trials_to_within(hr, br) if br else None,
        "guided_own": trials_to_within(hx, bx * 1.05) if bx else None,
        "random_own": trials_to_within(hr, br * 1.05) if br else None,
        "guided_common": (trials_to_within(hx, common) or len(hx) + 1) if common else None,
        "random_common": (trials_to_within(hr, common) or len(hr) + 1) if common else None,
        "guided_best_us": None if bx is None else bx * 1e6,
        "random_best_us": None if br is None else br * 1e6,
        "guided_at_least_random": None if bx is None or br is None else bx <= br,
    }


def format_rows(rows: List[dict]) -> str:
    import numpy as np

    name = rows[0].get("cost_model", "guided") if rows else "guided"
    lines = [f"{'seed':>4}  {'task':<28} {'to random best ' + name + '/random':>28} {'to 5% own':>14} "
             f"{'to 5% common':>14} {'best us ' + name + '/random':>24}"]
    for r in rows:
        lines.append(f"{r['seed']:>4}  {r['task'][:28]:<28} {r['guided_to_random_best']!s:>16} / "
                     f"{r['random_to_own_best']!s:<9} {r['guided_own']!s:>6} / {r['random_own']!s:<5} "
                     f"{r['guided_common']!s:>6} / {r['random_common']!s:<5} "
                     f"{r['guided_best_us'] or 0:>12.1f} / {r['random_best_us'] or 0:<9.1f}")
    pairs = {"to random's best": ("guided_to_random_best", "random_to_own_best"),
             "to 5% (own)": ("guided_own", "random_own"), "to 5% (common)": ("guided_common", "random_common")}
    for label, (gk, rk) in pairs.items():
        x = [r[gk] for r in rows if r[gk]]
        y = [r[rk] for r in rows if r[rk]]
        if x and y:
            mx, my = float(np.median(x)), float(np.median(y))
            lines.append(f"median trials {label}: {name} {mx:g}, random {my:g}, ratio {mx / my:.2f}")
    wins = [r["guided_at_least_random"] for r in rows if r["guided_at_least_random"] is not None]
    if wins:
        lines.append(f"{name}'s final best at least as good as random's: {sum(wins)} of {len(wins)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tvm_fusion_ext.tools.tuning_lab compare",
                                description=__doc__.splitlines()[0])
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
    p.add_argument("--cost-model", choices=("rank", "handover", "xgb"), default="rank",
                   help="the guided run's cost model")
    p.add_argument("--warm-start", action="append", metavar="DIR",
                   help="pre-train the guided run's cost model on these records (random search cannot use them)")
    args = p.parse_args(argv)
    if (args.model is None) == (args.dense is None):
        p.error("give a MODEL.onnx or --dense MxKxN")
    model = args.model
    if args.dense:
        from ...frontend import load_onnx
        from ...models import build_dense_onnx

        try:
            m, k, n = (int(d) for d in args.dense.lower().split("x"))
        except ValueError:
            p.error(f"--dense takes MxKxN, e.g. 128x384x1536 (got '{args.dense}')")
        model = load_onnx(build_dense_onnx(m, k, n))
    rows = compare(model, args.space, args.trials, [int(s) for s in args.seeds.split(",")], args.logs,
                   args.target, args.per_iter, say=lambda m: print(m, file=sys.stderr),
                   warm_start=tuple(args.warm_start or ()), population=args.population,
                   cost_model=args.cost_model)
    print(format_rows(rows))
    if args.json:
        from ...fileio import atomic_write

        atomic_write(args.json, lambda f: f.write(json.dumps(rows, indent=2)))
    return 0

