"""Candidate pools: distinct candidates of one task's design space, each measured once, for replaying searches.

``python -m tvm_fusion_ext.tools.tuning_lab pool collect --task minilm-ffn --space auto --count 1500 --work pools_work``
draws candidates the way MetaSchedule's evolutionary search does before its cost model has a say:

* **random**: a design space (sketch, or our template) replayed with fresh random decisions, then the
  space's postprocessors (a candidate they refuse is not a candidate: the search never sees it either);
* **mutation** (after ``--random-first`` draws, with probability ``--mutation-share``): one of the space's
  mutators applied to one of the 32 fastest candidates measured so far, so that the pool also holds the
  neighbourhood of good schedules that a search walks through;

keeps a draw only if its scheduled module is structurally new, asks the expert rules (``expert.check``) for
their verdict, builds and measures every candidate that builds, rejected ones included (the replay can then
show what the rule would have saved), with the tuner's steadier measurement (``LocalRunner``, number 3,
repeat 3, at least 20 ms per repeat), and appends one JSON line per candidate to
``<work>/<task>-<space>/candidates.jsonl`` as soon as it is measured. A killed collector loses nothing it
wrote; rerunning the same command resumes (a partial last line is cut off first) until ``--count``
candidates are in the file or the space has no new candidate left (``--give-up`` draws in a row without one).

Per candidate: the trace (MetaSchedule JSON, postprocessors included: it replays to the measured module),
MetaSchedule's ``PerStoreFeature`` rows (what ``XGBModel`` trains on), the run times (or the build / run
error), the expert verdict and rule, and the load of the machine when it was measured (``os.getloadavg()``
and the number of runnable processes): the machine is shared, and the noise must be visible.

``pack`` turns a work directory into the compact dataset committed under ``tuning_pools/`` (``pool_file.py``).
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from typing import Callable, List, Optional

import numpy as np

from ...errors import FusionExtError
from ...targets import TargetInfo
from ...tune.knob_features import trace_json

CANDIDATES_FILE = "candidates.jsonl"
META_FILE = "meta.json"
PARENTS = 32               # mutations start from one of the fastest this many candidates


@dataclass
class CollectOptions:
    task: str
    space: str = "auto"
    count: int = 1500
    seed: int = 1
    batch: int = 16                  # candidates built together (the builder pool starts once per batch)
    random_first: int = 200          # draws before any mutation
    mutation_share: float = 0.4
    give_up: int = 2000              # consecutive draws without a new candidate: the space is exhausted
    builder_workers: int = 2
    builder_timeout: float = 120.0
    progress: Optional[Callable[[str], None]] = print


# ----------------------------------------------------------------------------------------------- the journal

def work_dir(root: str, task: str, space: str) -> str:
    return os.path.join(root, f"{task}-{space}")


def read_records(path: str) -> List[dict]:
    """The candidates of a work directory (or a candidates file), after cutting a partial last line."""
    file = path if path.endswith(".jsonl") else os.path.join(path, CANDIDATES_FILE)
    if not os.path.isfile(file):
        return []
    repair(file)
    with open(file, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def repair(file: str) -> bool:
    """Cut an unterminated or unparsable last line (a collector killed mid-write); True if it did."""
    with open(file, "rb") as f:
        data = f.read()
    if not data:
        return False
    lines = data.split(b"\n")
    tail = lines.pop()
    keep = len(lines)
    if keep and not tail.strip():
        try:
            json.loads(lines[-1])
            return False
        except ValueError:
            keep -= 1
    good = b"".join(line + b"\n" for line in lines[:keep])
    with open(file, "r+b") as f:
        f.truncate(len(good))
    return True


class Journal:
    """Append-only, one fsync'd line per candidate."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        self.file = os.path.join(directory, CANDIDATES_FILE)

    def append(self, record: dict) -> None:
        with open(self.file, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())


def machine_info() -> dict:
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": model or platform.processor(), "cores": cores, "machine": platform.machine(),
            "system": platform.system()}


def machine_load() -> dict:
    """Load when a candidate is measured: 1/5/15-minute averages and the runnable processes right now."""
    one, five, fifteen = os.getloadavg()
    running = None
    try:
        with open("/proc/loadavg", encoding="utf-8") as f:
            running = int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        pass
    return {"loadavg": [round(one, 2), round(five, 2), round(fifteen, 2)], "runnable": running}


# ----------------------------------------------------------------------------------------------- sampling

class Sampler:
    """Distinct candidates of a task's design spaces: random decisions, or mutations of good candidates."""

    def __init__(self, task, target, seen: set):
        from tvm.s_tir import meta_schedule as ms

        from ...tune.expert import ExpertRules, RuleStats
        from ...tune.spaces import fixed_space_class, mutators, postprocs

        self.task, self.target, self.seen = task, target, seen
        post = [p for p in postprocs(target, task.space, RuleStats())
                if not isinstance(p, ExpertRules)]  # the verdict is recorded, not enforced
        space = fixed_space_class()(task.spaces, post, mutators(target, task.space))
        self.context = ms.TuneContext(mod=task.mod, target=target, space_generator=space, task_name=task.name,
                                      rand_state=1, num_threads=1)
        self.postprocs = list(self.context.space_generator.postprocs)
        probs = dict(self.context.space_generator.mutator_probs)
        self.mutators = list(probs)
        total = float(sum(float(v) for v in probs.values())) or 1.0
        self.mutator_probs = [float(probs[m]) / total for m in self.mutators]

    def default(self):
        """The template's own decisions (the first design space as generated), or None."""
        if self.task.space != "template":
            return None
        return self._finish(self.task.spaces[0].trace, seed=1, keep_decisions=True)

    def random(self, rng):
        index = int(rng.integers(len(self.task.spaces)))
        return self._finish(self.task.spaces[index].trace, int(rng.integers(1, 2**31 - 1)))

    def mutate(self, rng, parent_trace):
        from tvm.s_tir.meta_schedule import _ffi_api as ms_api

        if not self.mutators:
            return None
        mutator = self.mutators[int(rng.choice(len(self.mutators), p=self.mutator_probs))]
        seed = int(rng.integers(1, 2**31 - 1))
        try:
            trace = ms_api.MutatorApply(mutator, parent_trace, seed)
        except Exception:  # noqa: BLE001  (a mutator that cannot apply to this trace: draw again)
            return None
        return None if trace is None else self._finish(trace, seed, keep_decisions=True)

    def _finish(self, trace, seed: int, keep_decisions: bool = False):
        """Replay ``trace`` (its decisions, or fresh random ones) on the task and run the postprocessors;
        None if they refuse it or if the module was seen before."""
        import tvm_ffi
        from tvm import s_tir
        from tvm.s_tir.schedule import Trace

        sch = s_tir.Schedule(self.task.mod, seed=seed)
        replay = trace if keep_decisions else Trace(trace.insts, {})
        try:
            replay.apply_to_schedule(sch, remove_postproc=True)
            if not all(p.apply(sch) for p in self.postprocs):
                return None
        except Exception:  # noqa: BLE001  (ScheduleError from a decision the sketch cannot take)
            return None
        key = "%016x" % (int(tvm_ffi.structural_hash(sch.mod)) & (2**64 - 1))
        if key in self.seen:
            return None
        self.seen.add(key)
        return sch, key


def trace_of(record: dict, mod):
    """The record's trace, replayed on ``mod``: ``(schedule, trace)``."""
    from tvm import s_tir
    from tvm.s_tir.schedule import Trace

    sch = s_tir.Schedule(mod)
    Trace.apply_json_to_schedule(record["trace"], sch)
    return sch, sch.trace


# ----------------------------------------------------------------------------------------------- measuring

class Bench:
    """Builder and runner as the tuner uses them on this machine."""

    def __init__(self, target, opts: CollectOptions):
        from tvm.s_tir import meta_schedule as ms

        from ...deploy.threads import configure_cpu_threads
        from ...tune.intrin_stub import skip_tensor_intrin

        self.target = target
        self.builder = ms.builder.LocalBuilder(max_workers=opts.builder_workers, timeout_sec=opts.builder_timeout,
                                               initializer=skip_tensor_intrin)
        configure_cpu_threads(int(target.attrs.get("num-cores") or 0) or None)
        self.runner = ms.runner.LocalRunner(evaluator_config=ms.runner.EvaluatorConfig(
            number=3, repeat=3, min_repeat_ms=20, enable_cpu_cache_flush=False))

    def measure(self, schedules) -> List[dict]:
        from tvm.s_tir import meta_schedule as ms

        args = [ms.arg_info.ArgInfo.from_entry_func(s.mod, remove_preproc=True) for s in schedules]
        start = time.time()
        builds = self.builder.build([ms.builder.BuilderInput(s.mod, self.target) for s in schedules])
        build_s = (time.time() - start) / max(1, len(schedules))
        out = []
        for build, arg in zip(builds, args):
            row = {"build_s": round(build_s, 3), "build_error": None, "run_error": None, "run_secs": None}
            if build.error_msg is not None:
                row["build_error"] = _one_line(build.error_msg)
                out.append(row)
                continue
            row.update(machine_load())
            row["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
            (future,) = self.runner.run([ms.runner.RunnerInput(build.artifact_path, "cpu", arg)])
            res = future.result()
            if res.error_msg is not None:
                row["run_error"] = _one_line(res.error_msg)
            else:
                row["run_secs"] = [float(s.value if hasattr(s, "value") else s) for s in res.run_secs]
            _remove(build.artifact_path)
            out.append(row)
        return out


def _remove(path) -> None:
    import shutil

    if path:
        shutil.rmtree(os.path.dirname(str(path)), ignore_errors=True)


def _one_line(msg: str) -> str:
    lines = [ln.strip() for ln in str(msg).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "error")[:300]


def latency_us(record: dict) -> Optional[float]:
    secs = record.get("run_secs")
    if not secs or min(secs) <= 0:
        return None
    return float(np.mean(secs)) * 1e6


# ----------------------------------------------------------------------------------------------- collect

def prepare_task(name: str, space: str, target, seed: int = 1):
    """The pool task with its design spaces in ``space``; refuses a task whose space falls back to another."""
    from ...tune.intrin_stub import stub_tensor_intrinsics
    from ...tune.spaces import choose_space, register_custom_rules
    from .pool_tasks import get_task

    register_custom_rules()
    task = get_task(name, target)
    with stub_tensor_intrinsics(TargetInfo.of(target).is_cpu):  # TuneContext imports it: 30 s
        found = choose_space(task, target, space, seed)
    if not found or task.space != space:
        raise FusionExtError(f"pool task '{name}' has no '{space}' design space on {TargetInfo.of(target).kind}"
                             + (f" ({task.note})" if task.note else ""))
    return task


def collect(root: str, opts: CollectOptions, command: str = "") -> dict:
    """Fill ``<root>/<task>-<space>/`` up to ``opts.count`` candidates (resuming); returns a summary."""
    import tvm

    from ...targets import resolve_target
    from ...tune.intrin_stub import stub_tensor_intrinsics

    say = opts.progress or (lambda _m: None)
    target = resolve_target("llvm")
    directory = work_dir(root, opts.task, opts.space)
    records = read_records(directory)
    meta = _read_meta(directory)
    if meta is not None and (meta["task"], meta["space"]) != (opts.task, opts.space):
        raise FusionExtError(f"'{directory}' holds a pool of {meta['task']}/{meta['space']}")
    with stub_tensor_intrinsics(True):
        task = prepare_task(opts.task, opts.space, target, opts.seed)
        if meta is None:
            from ...records import target_label

            meta = {"task": opts.task, "space": opts.space, "kernel": task.name, "flops": task.flops,
                    "target": str(target), "target_label": target_label(target), "machine": machine_info(),
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "tvm": tvm.__version__,
                    "python": platform.python_version(), "command": command, "seed": opts.seed,
                    "measurement": "LocalRunner EvaluatorConfig(number=3, repeat=3, min_repeat_ms=20), "
                                   "TVM_NUM_THREADS = cores",
                    "sampling": {"random_first": opts.random_first, "mutation_share": opts.mutation_share,
                                 "parents": PARENTS}}
            _write_meta(directory, meta)
        journal = Journal(directory)
        seen = {r["hash"] for r in records}
        sampler = Sampler(task, target, seen)
        bench = Bench(target, opts)
        rng = np.random.default_rng([opts.seed, len(records)])
        misses = 0
        say(f"pool: {opts.task}/{opts.space} ({task.name}, {len(task.spaces)} design spaces): "
            f"{len(records)} candidates in {directory}, collecting up to {opts.count}")
        start, done_before = time.time(), len(records)
        while len(records) < opts.count and misses < opts.give_up:
            batch, misses = _draw_batch(sampler, records, rng, opts, misses)
            if not batch:
                break
            rows = bench.measure([sch for sch, _, _ in batch])
            feats = _features(sampler.context, [sch for sch, _, _ in batch])
            for (sch, key, origin), row, feat in zip(batch, rows, feats):
                from ...tune.expert import check

                rule = expert_verdict(check, sch, target)
                rec = {"id": len(records), "hash": key, "origin": origin[0], "parent": origin[1],
                       "expert_rule": rule, "trace": trace_json(sch.trace), "features": feat, **row}
                journal.append(rec)
                records.append(rec)
            _report(say, records, done_before, start, opts.count)
    meta = dict(meta, finished=time.strftime("%Y-%m-%dT%H:%M:%S"), candidates=len(records),
                exhausted=misses >= opts.give_up)
    _write_meta(directory, meta)
    say(f"pool: {len(records)} candidates in {directory}" + (" (space exhausted)" if meta["exhausted"] else ""))
    return meta


def _draw_batch(sampler: Sampler, records: List[dict], rng, opts: CollectOptions, misses: int):
    batch = []
    want = min(opts.batch, opts.count - len(records))
    if not records and want > 0:
        first = sampler.default()
        if first is not None:
            batch.append((*first, ("default", None)))
    parents = _parents(records)
    while len(batch) < want and misses < opts.give_up:
        drawn = len(records) + len(batch)
        if parents and drawn >= opts.random_first and rng.random() < opts.mutation_share:
            parent = parents[int(rng.integers(len(parents)))]
            got = sampler.mutate(rng, trace_of(parent, sampler.task.mod)[1])
            origin = ("mutation", parent["id"])
        else:
            got = sampler.random(rng)
            origin = ("random", None)
        if got is None:
            misses += 1
            continue
        misses = 0
        batch.append((*got, origin))
    return batch, misses


def _parents(records: List[dict]) -> List[dict]:
    measured = [r for r in records if latency_us(r) is not None]
    return sorted(measured, key=latency_us)[:PARENTS]


def _features(context, schedules) -> List[List[List[float]]]:
    from tvm.s_tir import meta_schedule as ms

    cands = [ms.MeasureCandidate(s, ms.arg_info.ArgInfo.from_entry_func(s.mod, remove_preproc=True))
             for s in schedules]
    feats = ms.feature_extractor.PerStoreFeature().extract_from(context, cands)
    return [np.asarray(f.numpy(), dtype=np.float32).tolist() for f in feats]


def expert_verdict(check, sch, target) -> Optional[str]:
    import tvm

    for _, func in sch.mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            try:
                rule = check(func, target)
            except Exception:  # noqa: BLE001  (the tuner's postproc treats an unreadable candidate as passing)
                rule = None
            if rule is not None:
                return rule
    return None


def _report(say, records, done_before, start, count) -> None:
    new = len(records) - done_before
    lat = [latency_us(r) for r in records]
    ok = [v for v in lat if v is not None]
    rate = (time.time() - start) / max(1, new)
    eta = rate * max(0, count - len(records))
    say(f"pool: {len(records)}/{count} | best {min(ok) if ok else float('nan'):.1f} us | "
        f"{len(records) - len(ok)} failed | {rate:.1f} s/candidate | ETA {eta / 60:.0f} min | "
        f"load {os.getloadavg()[0]:.2f}")


def _read_meta(directory: str) -> Optional[dict]:
    file = os.path.join(directory, META_FILE)
    if not os.path.isfile(file):
        return None
    with open(file, encoding="utf-8") as f:
        return json.load(f)


def _write_meta(directory: str, meta: dict) -> None:
    from ...fileio import atomic_write

    atomic_write(os.path.join(directory, META_FILE), lambda f: f.write(json.dumps(meta, indent=2)))
