"""Template knobs read back from tuning records, per kernel signature, for kernels no record matches.

A record tuned in the **template** space is the template's trace with MetaSchedule's decisions: every
``sample_perfect_tile`` / ``sample_categorical`` of it is one knob, in the order the template reads its knobs.
To name them, the template is run once more on the record's workload with its defaults while the knob names it
reads are recorded; the record's sample instructions must then be as many, each of the same shape (a perfect
tile of as many factors, a categorical over the same candidates), else the record does not transfer (its reason
is kept: a record of an older template version, say). Records from the **auto** space (MetaSchedule's own sketches:
their trace first removes our ``schedule_rule`` annotation) carry no knobs and are counted, never guessed at.

Of each tuned kernel, the fastest template-space record that names cleanly gives the knobs; its template keeps
those whose meaning does not depend on the rows (:meth:`TemplateRule.transferable_knobs`), keyed by the kernel's
signature (:mod:`..schedules.kernel_knobs`). The first directory offering a signature wins (directories in name
order), so a build is reproducible.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import tvm
from tvm import s_tir

from ..errors import TuningLogError
from ..records import FAILED_RUN_SECS, is_record_dir, open_database, read_manifest, target_label
from ..schedules.kernel_knobs import KernelKnobs, TransferredKnobs, kernel_signature

_SAMPLES = ("SamplePerfectTile", "SampleCategorical")


@dataclass
class TransferStats:
    """What the record directories gave: the table, and why other records did not transfer."""

    table: KernelKnobs = field(default_factory=KernelKnobs)
    directories: List[str] = field(default_factory=list)
    #: records that could not transfer, by reason ("auto space (no template knobs)", a stale trace, ...)
    not_transferred: Counter = field(default_factory=Counter)

    def summary(self) -> dict:
        return {"not_transferred": sum(self.not_transferred.values()),
                "not_transferred_reasons": dict(sorted(self.not_transferred.items()))}


class _RecordingKnobs:
    """Knobs that answer every read with the template's default and remember the names read, in order."""

    def __init__(self):
        self.names: List[str] = []

    def get(self, name, default=None):
        self.names.append(name)
        return default

    def __getattr__(self, name):  # a template reading a knob as an attribute (none does in schedule())
        return None


def record_directories(logs: str, target) -> List[str]:
    """``logs`` itself when it is a record directory, else the record directories under it, for ``target``
    (by manifest; a directory without one by its name's target suffix), in name order."""
    if not os.path.isdir(logs):
        raise TuningLogError(f"tuning-log directory '{logs}' does not exist")
    dirs = [logs] if is_record_dir(logs) else sorted(
        os.path.join(logs, d) for d in os.listdir(logs) if is_record_dir(os.path.join(logs, d)))
    label = target_label(target)

    def for_target(d):
        manifest = read_manifest(d)
        return manifest.get("target") == label if manifest else os.path.basename(d).endswith("-" + label)

    return [d for d in dirs if for_target(d)]


def collect(logs: str, target) -> TransferStats:
    """The knobs the records under ``logs`` (see :func:`record_directories`) give per kernel signature."""
    from ..schedules.registry import prepare_for_records

    stats = TransferStats()
    directories = record_directories(logs, target)
    if directories:
        prepare_for_records(target)  # the traces name our tensor intrinsics
    for directory in directories:
        try:
            by_workload = _records_by_workload(directory)
        except TuningLogError as err:  # another model's broken directory must not stop this build
            stats.not_transferred[f"unreadable record directory ({err})"] += 1
            continue
        stats.directories.append(directory)
        for workload, records in by_workload:
            _take_best(workload, records, directory, target, stats)
    return stats


def _records_by_workload(directory: str):
    """``[(workload module, its successful records fastest first)]`` of one record directory."""
    import tvm_ffi

    groups: Dict[int, Tuple[tvm.IRModule, list]] = {}
    for record in open_database(directory).get_all_tuning_records():
        secs = [float(s) for s in (record.run_secs or [])]
        if not secs or min(secs) >= FAILED_RUN_SECS:
            continue
        mod = record.workload.mod
        groups.setdefault(int(tvm_ffi.structural_hash(mod)), (mod, []))[1].append((sum(secs) / len(secs), record))
    return [(mod, [r for _, r in sorted(rs, key=lambda t: t[0])]) for mod, rs in groups.values()]


def _take_best(workload: tvm.IRModule, records: list, directory: str, target, stats: TransferStats) -> None:
    from ..schedules.registry import get_template
    from ..schedules.rule import TemplateRule, block_rule_of

    func = workload["main"]
    rule = block_rule_of(func)
    template = get_template(rule, target) if rule else None
    sig = kernel_signature(func)
    if template is None or sig is None:
        stats.not_transferred["kernel without a template"] += len(records)
        return
    if type(template).transferable_knobs is TemplateRule.transferable_knobs:
        stats.not_transferred[f"{rule} ({template.family}) transfers no knobs"] += len(records)
        return
    names, shapes = _knob_names(template, func, target)
    if names is None:
        stats.not_transferred[f"{rule} template fails on the record's workload"] += len(records)
        return
    for record in records:
        knobs, reason = _named_decisions(record.trace, names, shapes)
        if knobs is None:
            stats.not_transferred[reason] += 1
            continue
        transferred = template.transferable_knobs(knobs)
        if transferred:
            stats.table.add(TransferredKnobs(rule, sig, transferred, directory))
        else:
            stats.not_transferred[f"{rule} ({template.family}): no knob of the record keeps its meaning on "
                                  f"run-time rows"] += 1
        return  # the fastest template-space record decides; slower ones are neither used nor refused


def _knob_names(template, func, target) -> Tuple[Optional[List[str]], List[str]]:
    """The knob names the template reads on ``func``, in order, and the shapes of the samples it makes
    (``(None, [])`` when the template cannot schedule it with its defaults)."""
    sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
    block = template.find_block(sch)
    recorder = _RecordingKnobs()
    try:
        with target:
            template.schedule(sch, block, target, recorder)
    except Exception:  # noqa: BLE001  (a workload from another version of the operator: nothing can be named)
        return None, []
    return recorder.names, [_sample_shape(i) for i in sch.trace.insts if i.kind.name in _SAMPLES]


def _sample_shape(inst) -> str:
    """What a sample instruction is, decisions aside: a perfect tile's factor count, a categorical's candidates
    (a tile's ``max_innermost_factor`` follows the decision in our templates, so it is left out)."""
    if inst.kind.name == "SamplePerfectTile":
        return f"tile of {int(inst.attrs[0])}"
    return f"one of {[int(c) for c in inst.attrs[0]]}"


def _named_decisions(trace, names: List[str], wanted: List[str]) -> Tuple[Optional[dict], str]:
    """``({knob: decision}, "")``, or ``(None, why the trace does not name)``."""
    insts = list(trace.insts)
    if any(i.kind.name == "Unannotate" and "schedule_rule" in [str(a) for a in i.attrs] for i in insts):
        return None, "auto space (no template knobs)"
    samples = [i for i in insts if i.kind.name in _SAMPLES]
    if not names or len(names) != len(wanted):
        return None, "template reads its knobs out of step with its samples"
    if len(samples) != len(names):
        return None, f"trace has {len(samples)} samples where the template makes {len(names)} (stale or foreign)"
    shapes = [_sample_shape(i) for i in samples]
    if shapes != wanted:
        first = next(n for n, (a, b) in enumerate(zip(shapes, wanted)) if a != b)
        return None, (f"trace's sample {first + 1} is a {shapes[first]} where the template's '{names[first]}' is a "
                      f"{wanted[first]} (stale or foreign)")
    decisions = trace.decisions
    out = {}
    for name, inst in zip(names, samples):
        value = decisions[inst]
        out[name] = [int(v) for v in value] if inst.kind.name == "SamplePerfectTile" else int(value)
    return out, ""
