"""Noise-free replay of search strategies over pre-measured candidate pools (TenSet-style).

``python -m tvm_fusion_ext.tools.tuning_lab replay [--json] [--plot F.png] [--seeds 50] [--budget 128] [--k 8]
[--tasks minilm-ffn-auto,...] [--strategies random,xgb,...] [--pools tuning_pools]``

Every pool file (``tuning_pools/<task>-<space>.npz``) is one task. A search runs in rounds: the strategy
picks ``k`` candidates it has not measured yet, and "measures" them by looking up the latency recorded when
the pool was collected; a candidate that failed to build or run costs its trial and teaches a model that it
is bad. Every strategy gets the same ``k`` and budget; strategies that apply the expert rules never pick a
candidate the rules reject (in the tuner such a candidate is dropped before it is built: it costs no trial).

The measure, per task, strategy and seed:

* ``trials to random's best``: the first trial at which the strategy's best-so-far is as fast as what random
  search with the same seed had found after the whole budget (``budget + 1``: never within the budget). For
  random search itself this is the trial at which it found its final best;
* the strategy's final best after the budget, and whether it is at least as fast as random's; and, beside
  that strict comparison, whether random's final best is faster beyond the pool's measurement noise (a
  Mann-Whitney test on the two candidates' re-measurement rounds, ``replay_noise.py``).

Reported per task and strategy: medians and quartiles over seeds, the fraction of seeds at least as good as
random, and (``--plot``) best-so-far against trials, median and quartile band over seeds, relative to the
pool's best candidate. A seed gives the same result on every run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from ...errors import FusionExtError
from .pool_file import Pool, load_dir

# the repository's tuning_pools/, four levels above this file (tvm_fusion_ext/tools/tuning_lab/replay.py)
DEFAULT_POOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))), "tuning_pools")


@dataclass(frozen=True)
class Strategy:
    name: str
    describe: str
    model: Optional[str] = None      # None: random; "xgbmodel": MetaSchedule's XGBModel; "rank": RankXGB
    expert_features: bool = False
    rules: bool = False              # never pick a candidate the expert rules reject
    transfer: bool = False           # pre-train on the pools of other tasks with the same kernel (transfer_sources)
    explore: float = 0.0             # share of each round's picks drawn at random among the unmeasured
    options: tuple = ()              # extra model keyword arguments, as (name, value) pairs


STRATEGIES: Dict[str, Strategy] = {s.name: s for s in (
    Strategy("random", "uniform picks among the unmeasured candidates"),
    Strategy("xgb", "MetaSchedule's XGBModel as the driver trains it (per-store features), top-k of predictions",
             model="xgbmodel"),
    Strategy("xgb-expert", "XGBModel + expert rules (filter) + expert features appended to every store row",
             model="xgbmodel", expert_features=True, rules=True),
    Strategy("xgb-transfer", "XGBModel pre-trained on other tasks' pools of the same kernel (as --warm-start does)",
             model="xgbmodel", transfer=True),
    Strategy("rank", "ours: pairwise-ranking XGBoost on per-candidate rows, retrained every round",
             model="rank", expert_features=False),
    Strategy("rank-expert", "ours + expert rules and expert features", model="rank", expert_features=True,
             rules=True),
    Strategy("rank-expert-transfer", "ours + expert rules and features + pre-trained on other tasks' pools of the "
             "same kernel",
             model="rank", expert_features=True, rules=True, transfer=True),
    Strategy("rank-knobs", "ours on the trace's decisions and the expert features (no store features), trees of "
             "depth 3, expert rules", model="rank", expert_features=True, rules=True,
             options=(("store", False), ("knobs", True), ("params", (("max_depth", 3),)))),
    Strategy("rank-knobs-transfer", "rank-knobs pre-trained on other tasks' pools of the same kernel",
             model="rank", expert_features=True, rules=True, transfer=True,
             options=(("store", False), ("knobs", True), ("params", (("max_depth", 3),)))),
    Strategy("rank-all", "ours on store, expert and knob features, trees of depth 3, expert rules", model="rank",
             expert_features=True, rules=True, options=(("knobs", True), ("params", (("max_depth", 3),)))),
    Strategy("handover-transfer", "rank-knobs-transfer picks the first 64 trials, xgb-transfer the rest; both "
             "learn from every measurement", model="handover", expert_features=True, rules=True, transfer=True,
             options=(("first", "rank-knobs-transfer"), ("then", "xgb-transfer"), ("at", 64))),
)}
DEFAULT_STRATEGIES = ("random", "xgb", "xgb-expert", "xgb-transfer", "rank-expert-transfer")


# ----------------------------------------------------------------------------------------------- one search

@dataclass
class SearchResult:
    order: np.ndarray        # pool indices in the order they were measured
    curve: np.ndarray        # best-so-far latency (us) after each trial (inf before the first success)

    @property
    def final_best(self) -> float:
        return float(self.curve[-1]) if len(self.curve) else float("inf")

    def final_index(self, pool: Pool) -> int:
        """The pool index of the final best candidate (-1 when nothing measured succeeded)."""
        if not len(self.curve) or not np.isfinite(self.curve[-1]):
            return -1
        lat = pool.latency_us[self.order]
        return int(self.order[int(np.nanargmin(np.where(np.isfinite(lat), lat, np.inf)))])


def _seed(seed: int, name: str) -> int:
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) % 2**31


def make_model(strategy: Strategy, pool: Pool, others: Sequence[Pool] = ()):
    """A fresh cost model for one search (pre-trained on ``others`` when the strategy transfers)."""
    from .replay_models import Handover, MetaScheduleXGB, RankXGB

    if strategy.model is None:
        return None
    kwargs = dict(strategy.options)
    if strategy.model == "handover":
        # each part as its own strategy makes it (pre-trained on the same sources when it transfers)
        return Handover(make_model(STRATEGIES[kwargs["first"]], pool, others),
                        make_model(STRATEGIES[kwargs["then"]], pool, others), kwargs["at"])
    if strategy.model == "xgbmodel":
        model = MetaScheduleXGB(pool, expert_features=strategy.expert_features, **kwargs)
    elif strategy.model == "rank":
        model = RankXGB(pool, expert_features=strategy.expert_features, **kwargs)
    else:
        raise FusionExtError(f"unknown cost model '{strategy.model}'")
    if strategy.transfer:
        model.pretrain(transfer_sources(pool, others))
    return model


def transfer_sources(pool: Pool, others: Sequence[Pool]) -> List[Pool]:
    """The pools a transferring strategy pre-trains on: other tasks (other model shapes) of the same kernel.

    Another kernel's pool is not a source: the order of its schedules says little about this kernel's (the
    FFN dense's pool pre-training the attention model made it need 94.5 trials instead of 53). The same
    task's pool in another design space is not one either: that would be this task's own measurements."""
    return [o for o in others if o.meta["task"] != pool.meta["task"] and o.meta["kernel"] == pool.meta["kernel"]]


def search(pool: Pool, strategy: Strategy, seed: int, budget: int = 128, k: int = 8, model=None) -> SearchResult:
    """One replayed search of ``budget`` trials in rounds of ``k`` (``model``: a fresh model from
    :func:`make_model`, or None to make one; random search needs none)."""
    if model is None and strategy.model is not None:
        model = make_model(strategy, pool)
    rng = np.random.default_rng(_seed(seed, strategy.name))
    allowed = ~pool.rejected() if strategy.rules else np.ones(len(pool), bool)
    picked = np.zeros(len(pool), bool)
    order: List[int] = []
    while len(order) < budget:
        cand = np.flatnonzero(allowed & ~picked)
        if cand.size == 0:
            break
        n = min(k, budget - len(order), cand.size)
        picks = _pick(model, cand, n, rng, strategy.explore, _seed(seed + len(order), strategy.name))
        picked[picks] = True
        order.extend(int(i) for i in picks)
        if model is not None:
            model.observe(picks)
    lat = pool.latency_us[np.asarray(order, dtype=np.int64)]
    curve = np.minimum.accumulate(np.where(np.isfinite(lat), lat, np.inf)) if len(order) else np.zeros(0)
    return SearchResult(np.asarray(order, dtype=np.int64), curve)


def _pick(model, cand: np.ndarray, n: int, rng, explore: float, score_seed: int) -> np.ndarray:
    scores = model.score(cand, score_seed) if model is not None else None
    if scores is None:
        return rng.choice(cand, size=n, replace=False)
    n_random = int(round(explore * n))
    # ties (e.g. identical features) are broken at random, not by pool order
    order = np.lexsort((rng.random(cand.size), -scores))
    greedy = cand[order[:n - n_random]]
    if n_random == 0:
        return greedy
    rest = np.setdiff1d(cand, greedy, assume_unique=True)
    return np.concatenate([greedy, rng.choice(rest, size=min(n_random, rest.size), replace=False)])


# ----------------------------------------------------------------------------------------------- the measure

def trials_to(curve: np.ndarray, bar: float) -> int:
    """1-based trial at which ``curve`` first gets to ``bar`` or below; ``len(curve) + 1`` if never."""
    hit = np.flatnonzero(curve <= bar)
    return int(hit[0]) + 1 if hit.size else len(curve) + 1


def _quartiles(values) -> List[float]:
    q1, med, q3 = np.percentile(np.asarray(values, dtype=np.float64), [25, 50, 75])
    return [float(q1), float(med), float(q3)]


def evaluate(pool: Pool, strategies: Sequence[Strategy], seeds: Sequence[int], budget: int, k: int,
             others: Sequence[Pool] = (), say=None) -> dict:
    """Every strategy × seed on one pool; the task's entry of the report."""
    runs: Dict[str, List[SearchResult]] = {}
    timing: Dict[str, float] = {}
    for strategy in [STRATEGIES["random"]] + [s for s in strategies if s.name != "random"]:
        start = time.time()
        prototype = make_model(strategy, pool, others) if strategy.model is not None else None
        runs[strategy.name] = [search(pool, strategy, s, budget, k,
                                      model=None if prototype is None else prototype.clone_for(pool))
                               for s in seeds]
        timing[strategy.name] = time.time() - start
        if say:
            say(f"replay: {pool.name} {strategy.name}: {len(seeds)} seeds in {timing[strategy.name]:.0f} s")
    bars = [r.final_best for r in runs["random"]]
    bar_index = [r.final_index(pool) for r in runs["random"]]
    best = float(np.nanmin(pool.latency_us))
    out = {"pool": os.path.basename(pool.path), "kernel": pool.meta.get("kernel"), "candidates": len(pool),
           "measured": int(pool.measured().sum()), "expert_rejected": int(pool.rejected().sum()),
           "pool_best_us": best, "pool_median_us": float(np.nanmedian(pool.latency_us)),
           "transfer_sources": [o.name for o in transfer_sources(pool, others)],
           "remeasured": bool(pool.meta.get("remeasured")), "strategies": {}}
    for name, results in runs.items():
        if name != "random" and name not in {s.name for s in strategies}:
            continue
        trials = [trials_to(r.curve, bar) for r, bar in zip(results, bars)]
        finals = [r.final_best for r in results]
        curves = np.stack([_pad(r.curve, budget) for r in results]) / best
        tq, fq = _quartiles(trials), _quartiles(finals)
        out["strategies"][name] = {
            "trials_to_random_best_median": tq[1], "trials_to_random_best_q1": tq[0],
            "trials_to_random_best_q3": tq[2],
            "reached_random_best_fraction": float(np.mean([t <= budget for t in trials])),
            "final_best_us_median": fq[1], "final_best_us_q1": fq[0], "final_best_us_q3": fq[2],
            "at_least_random_fraction": float(np.mean([f <= b for f, b in zip(finals, bars)])),
            "at_least_random_within_noise_fraction": _within_noise(pool, results, bar_index),
            "final_best_vs_pool_best_median": fq[1] / best,
            "curve_vs_pool_best": {"median": _round(np.median(curves, axis=0)),
                                   "q1": _round(np.percentile(curves, 25, axis=0)),
                                   "q3": _round(np.percentile(curves, 75, axis=0))},
            "seconds": round(timing[name], 1),
            "trials_to_random_best": trials, "final_best_us": [round(f, 3) for f in finals],
        }
    return out


def _within_noise(pool: Pool, results: Sequence[SearchResult], bar_index: Sequence[int]) -> float:
    """Share of seeds in which random's final best is not faster than the strategy's beyond the pool's
    measurement noise (``replay_noise.py``)."""
    from .replay_noise import shown_faster

    ok = []
    for r, theirs in zip(results, bar_index):
        ours = r.final_index(pool)
        ok.append(theirs < 0 or (ours >= 0 and not shown_faster(pool, theirs, ours)))
    return float(np.mean(ok))


def _pad(curve: np.ndarray, budget: int) -> np.ndarray:
    if len(curve) >= budget:
        return curve[:budget]
    last = curve[-1] if len(curve) else np.inf
    return np.concatenate([curve, np.full(budget - len(curve), last)])


def _round(a) -> List[float]:
    return [round(float(v), 4) if np.isfinite(v) else None for v in a]


def replay(pools: Sequence[Pool], strategies: Sequence[Strategy], seeds: Sequence[int], budget: int = 128,
           k: int = 8, all_pools: Optional[Sequence[Pool]] = None, say=None) -> dict:
    others = list(all_pools if all_pools is not None else pools)
    report = {"budget": budget, "k": k, "seeds": len(seeds), "seed_list": [int(s) for s in seeds],
              "strategies": {s.name: s.describe for s in strategies}, "tasks": {}}
    for pool in pools:
        report["tasks"][pool.name] = evaluate(pool, strategies, seeds, budget, k, others, say)
        _against_template(report["tasks"][pool.name], pool, others)
    report["machine"] = pools[0].meta.get("machine") if pools else None
    return report


def _against_template(entry: dict, pool: Pool, others: Sequence[Pool]) -> None:
    """For an ``auto`` pool whose task also has a ``template`` pool: each strategy's final best as a share of
    the template's throughput (the template pool's best; > 1: the generic search found a faster schedule)."""
    if pool.meta.get("space") != "auto":
        return
    template = [o for o in others if o.meta["task"] == pool.meta["task"] and o.meta.get("space") == "template"]
    if not template:
        return
    best = float(np.nanmin(template[0].latency_us))
    entry["template_pool_best_us"] = best
    for s in entry["strategies"].values():
        s["throughput_vs_template_best_median"] = best / s["final_best_us_median"]
        s["seeds_at_least_0.9_of_template"] = float(np.mean([best / f >= 0.9 for f in s["final_best_us"]]))


# ----------------------------------------------------------------------------------------------- output

def format_table(report: dict) -> str:
    budget = report["budget"]
    lines = [f"replay: budget {budget} trials, {report['k']} per round, {report['seeds']} seeds; "
             f"trials to random's final best (median [q1, q3]; {budget + 1} = not reached), final best "
             f"(median, us), share of seeds at least as good as random (strictly; and unless random's best is "
             f"faster beyond the pool's measurement noise)"]
    head = (f"{'task':<26} {'strategy':<22} {'trials to random best':>24} {'final best us':>14} {'>= random':>10}"
            f" {'not beaten':>11}")
    lines.append(head)
    for task, entry in report["tasks"].items():
        for name, s in entry["strategies"].items():
            lines.append(f"{task:<26} {name:<22} {s['trials_to_random_best_median']:>8.1f} "
                         f"[{s['trials_to_random_best_q1']:>5.1f}, {s['trials_to_random_best_q3']:>5.1f}]"
                         f"{'':>4} {s['final_best_us_median']:>14.1f} {100 * s['at_least_random_fraction']:>9.0f}%"
                         f" {100 * s.get('at_least_random_within_noise_fraction', float('nan')):>10.0f}%")
        lines.append(f"{'':<26} (pool: {entry['candidates']} candidates, best {entry['pool_best_us']:.1f} us, "
                     f"median {entry['pool_median_us']:.1f} us, {entry['expert_rejected']} rejected by the rules)")
        if "template_pool_best_us" in entry:
            lines.append(f"{'':<26} (against the template pool's best, {entry['template_pool_best_us']:.1f} us: "
                         + ", ".join(f"{n} {s['throughput_vs_template_best_median']:.2f}x"
                                     for n, s in entry["strategies"].items()) + ")")
    return "\n".join(lines)


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(report["tasks"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for name, s in report["tasks"][task]["strategies"].items():
            c = s["curve_vs_pool_best"]
            x = np.arange(1, len(c["median"]) + 1)
            med = np.array([np.nan if v is None else v for v in c["median"]])
            lo = np.array([np.nan if v is None else v for v in c["q1"]])
            hi = np.array([np.nan if v is None else v for v in c["q3"]])
            (line,) = ax.plot(x, med, label=name, lw=1.5)
            ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("trials")
        ax.set_yscale("log")
        ax.set_ylim(0.95, 3.0)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("best so far / pool best (median, IQR)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tvm_fusion_ext.tools.tuning_lab replay",
                                description=__doc__.splitlines()[0])
    p.add_argument("--pools", default=DEFAULT_POOLS, help="directory of pool files (default: tuning_pools/)")
    p.add_argument("--tasks", help="comma-separated pool names (e.g. minilm-ffn-auto); default: all")
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES),
                   help=f"comma-separated, from: {', '.join(STRATEGIES)}")
    p.add_argument("--seeds", type=int, default=50, help="N seeds, FIRST..FIRST+N-1")
    p.add_argument("--first-seed", type=int, default=1,
                   help="first seed (default 1; another range checks a choice made on these seeds)")
    p.add_argument("--budget", type=int, default=128)
    p.add_argument("--k", type=int, default=8, help="candidates per round")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE", help="print the report as JSON (or write FILE)")
    p.add_argument("--plot", metavar="F.png")
    args = p.parse_args(argv)
    try:
        pools = load_dir(args.pools)
        chosen = pools
        if args.tasks:
            names = [t.strip() for t in args.tasks.split(",") if t.strip()]
            unknown = [t for t in names if t not in {q.name for q in pools}]
            if unknown:
                raise FusionExtError(f"no pool for task(s) {', '.join(unknown)} in {args.pools} "
                                     f"(have: {', '.join(q.name for q in pools)})")
            chosen = [q for q in pools if q.name in names]
        unknown = [s for s in args.strategies.split(",") if s not in STRATEGIES]
        if unknown:
            raise FusionExtError(f"unknown strategy {', '.join(unknown)} (known: {', '.join(STRATEGIES)})")
        if args.budget < 1 or args.k < 1 or args.seeds < 1:
            raise FusionExtError("--budget, --k and --seeds must be >= 1")
        strategies = [STRATEGIES[s] for s in args.strategies.split(",")]
        seeds = list(range(args.first_seed, args.first_seed + args.seeds))
        report = replay(chosen, strategies, seeds, args.budget, args.k, all_pools=pools,
                        say=lambda m: print(m, file=sys.stderr, flush=True))
    except FusionExtError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json == "-":
        print(json.dumps(report, indent=1))
    else:
        print(format_table(report))
        if args.json:
            from ...fileio import atomic_write

            atomic_write(args.json, lambda f: f.write(json.dumps(report, indent=1)))
    if args.plot:
        plot(report, args.plot)
    return 0

