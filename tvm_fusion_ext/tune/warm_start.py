"""Warm-start the XGBoost cost model from records already measured (AutoTVM's / Ansor's transfer learning).

MetaSchedule's ``XGBModel`` starts empty in every run and predicts random scores until it has seen
``num_warmup_samples`` measurements. Two kinds of measurements are usually already on disk:

* the run's own record directory when a run resumes (a killed or topped-up run would otherwise throw away
  everything the earlier run taught the model);
* record directories of other models tuned for the same target (``--warm-start DIR``): other shapes of the
  same kernels. ``XGBModel`` normalises each workload's costs by that workload's best, so what transfers is
  which schedules are *relatively* good (tile shapes, vector widths, unrolling), not absolute times.

Records measured on another target are not used: their features describe code for another machine.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterable, List

from .. import records


@dataclass
class WarmStart:
    records: int = 0                 # records the model was trained on
    workloads: int = 0               # distinct kernels they belong to
    other_target: int = 0            # records skipped: measured on another target
    unreplayable: int = 0            # records skipped: their trace no longer applies to their workload
    sources: List[str] = field(default_factory=list)
    by_source: Dict[str, int] = field(default_factory=dict)  # records of this target in each source

    def to_dict(self) -> dict:
        return {"records": self.records, "workloads": self.workloads, "skipped_other_target": self.other_target,
                "skipped_unreplayable": self.unreplayable, "sources": list(self.sources)}


def record_dirs(path: str) -> List[str]:
    """``path`` itself if it is a record directory, else the record directories directly under it."""
    if not os.path.isdir(path):
        raise records.TuningLogError(f"--warm-start: '{path}' is not a directory")
    if records.is_record_dir(path):
        return [path]
    found = sorted(os.path.join(path, d) for d in os.listdir(path) if records.is_record_dir(os.path.join(path, d)))
    if not found:
        raise records.TuningLogError(f"--warm-start: '{path}' holds no tuning-record directories")
    return found


def warm_start(cost_model, sources: Iterable[str], target) -> WarmStart:
    """Train ``cost_model`` (``XGBModel`` or ``RankModel``) on the records of ``sources`` measured on ``target``."""
    import tvm_ffi

    from ..schedules.registry import prepare_for_records

    prepare_for_records(target)  # the traces name our tensor intrinsics
    label = records.target_label(target)
    stats = WarmStart()
    groups: Dict[int, tuple] = {}
    for path in sources:
        stats.sources.append(path)
        for rec in records.open_database(path).get_all_tuning_records():
            if rec.target is None or records.target_label(rec.target) != label:
                stats.other_target += 1
                continue
            stats.by_source[path] = stats.by_source.get(path, 0) + 1
            key = int(tvm_ffi.structural_hash(rec.workload.mod))
            groups.setdefault(key, (rec.workload.mod, []))[1].append(rec)
    prepared = _prepare(groups.values(), target, stats)
    # Train once, on everything: XGBModel (re)trains inside ``update`` whenever its data grew by a fifth, which
    # would train once per kernel here; a huge ``last_train_size`` defers that until the last kernel's data.
    for i, (context, candidates, results) in enumerate(prepared):
        cost_model.last_train_size = 0 if i == len(prepared) - 1 else sys.maxsize
        cost_model.update(context, candidates, results)
    if prepared and hasattr(cost_model, "freeze_as_base"):
        cost_model.freeze_as_base()  # RankModel: the other tasks become a fixed base (see its docstring)
    return stats


def _prepare(groups, target, stats: WarmStart) -> list:
    """Per kernel: a TuneContext (XGBModel groups and normalises data by its module) and the records as
    measure candidates and runner results."""
    from tvm.s_tir import meta_schedule as ms

    prepared = []
    for mod, recs in groups:
        candidates, results = [], []
        for rec in recs:
            try:
                candidates.append(rec.as_measure_candidate())
            except Exception:  # noqa: BLE001  (a template changed since: the trace no longer replays)
                stats.unreplayable += 1
                continue
            secs = [float(s) for s in rec.run_secs] if rec.run_secs else []
            ok = secs and 0 < min(secs) and max(secs) < records.FAILED_RUN_SECS
            results.append(ms.runner.RunnerResult(run_secs=rec.run_secs if ok else None,
                                                  error_msg=None if ok else "failed when it was measured"))
        if candidates:
            context = ms.TuneContext(mod=mod, target=target, task_name="warm-start", num_threads=1)
            prepared.append((context, candidates, results))
            stats.records += len(candidates)
            stats.workloads += 1
    return prepared
