"""Bookkeeping during a tuning run: progress line, cost-model predictions, manifest after every batch.

A MetaSchedule measure callback placed after ``AddToDatabase`` (the records are on disk when the manifest
says so) and before ``UpdateCostModel`` (so the predictions it stores were made before the model saw these
measurements: the rank correlation in ``quality.py`` is then an honest out-of-sample number).
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional

import numpy as np

from .. import records
from .quality import task_quality


def _latency(result) -> Optional[float]:
    if result is None or result.error_msg is not None or not result.run_secs:
        return None
    secs = [float(s.value if hasattr(s, "value") else s) for s in result.run_secs]
    return float(np.mean(secs)) if secs and min(secs) > 0 else None


class Progress:
    def __init__(self, out: str, tasks: list, database, target, budget: int, say: Callable[[str], None],
                 base: dict):
        self.out, self.tasks, self.database, self.budget, self.say = out, tasks, database, budget, say
        self.base = base
        self.cost_model = None
        self.contexts: list = []
        self.new_trials = 0
        self.started = time.monotonic()
        prev_tasks = base.get("tasks", {}) or {}
        self.state: Dict[str, dict] = {}
        for task in tasks:
            prev = prev_tasks.get(task.name, {})
            self.state[task.name] = {"trials": int(prev.get("trials", 0)), "best": _best_in_db(database, task.mod),
                                     "history": [], "failed": int(prev.get("failed", 0))}

    # -- the MetaSchedule callback -------------------------------------------------------------------------
    def callback(self):
        from tvm.ir.utils import derived_object
        from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

        progress = self

        @derived_object
        class _Callback(PyMeasureCallback):
            def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
                progress.record(int(task_id), list(measure_candidates), list(runner_results), list(builder_results))

        return _Callback()

    def _predict(self, task_id: int, candidates) -> List[Optional[float]]:
        model = self.cost_model
        fitted = model is not None and model.booster is not None and model.data_size >= model.num_warmup_samples
        if not fitted or task_id >= len(self.contexts):
            return [None] * len(candidates)  # before warm-up XGBModel returns random scores: not a prediction
        try:
            return [float(s) for s in model.predict(self.contexts[task_id], candidates)]
        except Exception:  # noqa: BLE001  (quality is a report; never let it stop tuning)
            return [None] * len(candidates)

    def record(self, task_id: int, candidates, results, builds=None) -> None:
        task = self.tasks[task_id]
        st = self.state[task.name]
        preds = self._predict(task_id, candidates)
        errors = [_failure(b, r) for b, r in zip(builds or [None] * len(results), results)]
        failed = [e for e in errors if e]
        st["failed"] += len(failed)
        for pred, res in zip(preds, results):
            lat = _latency(res)
            st["history"].append((lat, pred))
            st["trials"] += 1
            self.new_trials += 1
            if lat is not None and (st["best"] is None or lat < st["best"]):
                st["best"] = lat
        self.write()
        best = st["best"]
        tuned = sum(1 for s in self.state.values() if s["best"] is not None)
        self.say(f"tune: trials {self.new_trials}/{self.budget} | tasks {tuned}/{len(self.tasks)} with records | "
                 f"{task.name}: {len(results)} measured, best "
                 f"{'-' if best is None else f'{best * 1e6:.2f} us'} | model total {self._total_us()} | "
                 f"ETA {self._eta()}" + (f" | {len(failed)} failed ({failed[0]})" if failed else ""))

    def _eta(self) -> str:
        """Time left at this run's pace so far (builds, measurements and model updates all included)."""
        left = max(self.budget - self.new_trials, 0)
        if not self.new_trials:
            return "-"
        return format_duration((time.monotonic() - self.started) / self.new_trials * left)

    # -- manifest --------------------------------------------------------------------------------------------
    def _total_us(self) -> str:
        if any(s["best"] is None for s in self.state.values()):
            return "-"
        return f"{sum(t.weight * self.state[t.name]['best'] for t in self.tasks) * 1e6:.2f} us"

    def manifest(self, seconds: Optional[float] = None) -> dict:
        prev_tasks = dict(self.base.get("tasks", {}) or {})
        tasks = {}
        for task in self.tasks:
            st = self.state[task.name]
            best = st["best"]
            entry = dict(prev_tasks.get(task.name, {}))
            entry.update({"space": task.space, "note": task.note, "rule": task.rule, "weight": task.weight,
                          "flops": task.flops, "trials": st["trials"], "failed": st["failed"],
                          "best_us": None if best is None else best * 1e6,
                          "gflops": None if best is None or not task.flops else task.flops / best / 1e9,
                          "expert_rules": task.stats.to_dict()})
            if st["history"]:
                entry["quality"] = task_quality(st["history"])
            tasks[task.name] = entry
        prev_tasks.update(tasks)
        manifest = dict(self.base)
        manifest.update({"tasks": prev_tasks, "trials": sum(int(t.get("trials", 0)) for t in prev_tasks.values()),
                         "expert_rejections": sum(t.get("expert_rules", {}).get("rejected_total", 0)
                                                  for t in prev_tasks.values())})
        if seconds is not None:
            manifest["last_run_seconds"] = round(seconds, 1)
        return manifest

    def write(self, seconds: Optional[float] = None) -> dict:
        manifest = self.manifest(seconds)
        records.write_manifest(self.out, manifest)
        return manifest

    def finish(self, seconds: Optional[float] = None) -> dict:
        return self.write(seconds)


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _failure(build, result) -> Optional[str]:
    """One line saying why a candidate has no measurement (build error, timeout, run-time error), or None."""
    for stage, res in (("build", build), ("run", result)):
        msg = getattr(res, "error_msg", None) if res is not None else None
        if msg:
            lines = [ln.strip() for ln in str(msg).strip().splitlines() if ln.strip()]
            return f"{stage}: {(lines[-1] if lines else 'error')[:160]}"
    return None


def _best_in_db(database, mod) -> Optional[float]:
    if not database.has_workload(mod):
        return None
    top = database.get_top_k(database.commit_workload(mod), 1)
    if not top or not top[0].run_secs:
        return None
    return float(np.mean([float(s.value if hasattr(s, "value") else s) for s in top[0].run_secs]))
