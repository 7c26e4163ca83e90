"""The compact pool dataset: one ``.npz`` per (task, space) under ``tuning_pools/`` (format in its README).

``pack`` reads a collection journal (``collect.py``), adds the expert features of every candidate (its trace
replayed on the task) and writes arrays; ``load`` gives them back as a :class:`Pool`, which is all the replay
benchmark needs: no TVM object is rebuilt to replay a search.

PerStoreFeature rows repeat a lot across candidates (the epilogue's store, the init store): they are stored
once (``feature_rows``) and referenced by index (``feature_index``, candidate ``i`` owns entries
``feature_offsets[i]:feature_offsets[i + 1]``).
"""

from __future__ import annotations

import io
import json
import os
import zlib
from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from ...errors import FusionExtError
from ...targets import TargetInfo

FORMAT_VERSION = 1
ORIGINS = ("default", "random", "mutation")
STATUS = ("measured", "build_error", "run_error")
OPTIONAL_ARRAYS = ("first_latency_us", "rounds_us", "rounds_load")


@dataclass
class Pool:
    """One task's candidates; index ``i`` is candidate ``i`` everywhere."""

    meta: dict
    latency_us: np.ndarray          # float64 [n], NaN where it failed to build or run
    run_us: np.ndarray              # float32 [n, repeats], NaN where it failed
    status: np.ndarray              # int8 [n], index into STATUS
    expert_rule: np.ndarray         # int8 [n], 0 = passes, else 1 + index into meta["expert_rules"]
    origin: np.ndarray              # int8 [n], index into ORIGINS
    parent: np.ndarray              # int32 [n], -1 for none
    load: np.ndarray                # float32 [n, 4]: loadavg 1/5/15 min, runnable processes (NaN: unknown)
    feature_rows: np.ndarray        # float32 [u, 164] unique PerStoreFeature rows
    feature_index: np.ndarray       # int32 [total rows]
    feature_offsets: np.ndarray     # int64 [n + 1]
    expert_features: np.ndarray     # float32 [n, len(meta["expert_feature_names"])]
    traces: Optional[List] = None   # MetaSchedule trace JSON per candidate (loaded on demand)
    path: str = ""
    # after ``pool remeasure`` (pool_remeasure.py): latency_us is the minimum of rounds_us
    first_latency_us: Optional[np.ndarray] = None  # float64 [n], the collector's figure
    rounds_us: Optional[np.ndarray] = None          # float32 [n, rounds]
    rounds_load: Optional[np.ndarray] = None        # float32 [rounds, 4], load at the start of each round

    def __len__(self) -> int:
        return int(self.latency_us.shape[0])

    @property
    def name(self) -> str:
        return f"{self.meta['task']}-{self.meta['space']}"

    def store_features(self, i: int) -> np.ndarray:
        """Candidate ``i``'s PerStoreFeature rows (what MetaSchedule's feature extractor returned)."""
        return self.feature_rows[self.feature_index[self.feature_offsets[i]:self.feature_offsets[i + 1]]]

    def measured(self) -> np.ndarray:
        return np.isfinite(self.latency_us)

    def rejected(self) -> np.ndarray:
        return self.expert_rule > 0


# ----------------------------------------------------------------------------------------------- pack

def pack(work: str, out: str) -> str:
    """Write the journal in ``work`` as pool file ``out``; returns a one-line summary."""
    from ...targets import resolve_target
    from ...tune.expert import RULES
    from ...tune.expert_features import FEATURE_NAMES, candidate_features, machine_of
    from .collect import latency_us, prepare_task, read_records, trace_of

    meta_file = os.path.join(work, "meta.json")
    if not os.path.isfile(meta_file):
        raise FusionExtError(f"'{work}' is not a pool collection directory (no meta.json)")
    with open(meta_file, encoding="utf-8") as f:
        meta = json.load(f)
    records = read_records(work)
    if not records:
        raise FusionExtError(f"'{work}' holds no candidates")
    target = _measured_target(meta)
    from ...tune.intrin_stub import stub_tensor_intrinsics

    with stub_tensor_intrinsics(True):
        task = prepare_task(meta["task"], meta["space"], target, int(meta.get("seed", 1)))
        machine = machine_of(target)
        expert = np.stack([candidate_features(trace_of(r, task.mod)[0].mod, target, machine) for r in records])
    n = len(records)
    repeats = max((len(r["run_secs"]) for r in records if r.get("run_secs")), default=0)
    run_us = np.full((n, repeats), np.nan, dtype=np.float32)
    for i, r in enumerate(records):
        if r.get("run_secs"):
            run_us[i, :len(r["run_secs"])] = np.asarray(r["run_secs"]) * 1e6
    rows, index, offsets = _dedupe_rows([r["features"] for r in records])
    meta = dict(meta, format_version=FORMAT_VERSION, candidates=n, expert_rules=list(RULES),
                expert_feature_names=list(FEATURE_NAMES), origins=list(ORIGINS), status=list(STATUS),
                machine_model={"cores": machine.cores, "lanes": machine.lanes, "l1_bytes": machine.l1_bytes,
                               "l2_bytes": machine.l2_bytes, "register_bytes": machine.register_bytes},
                errors={str(i): r.get("build_error") or r.get("run_error") for i, r in enumerate(records)
                        if r.get("build_error") or r.get("run_error")})
    pool = Pool(
        meta=meta,
        latency_us=np.array([latency_us(r) if latency_us(r) is not None else np.nan for r in records]),
        run_us=run_us,
        status=np.array([0 if r.get("run_secs") else (1 if r.get("build_error") else 2) for r in records],
                        dtype=np.int8),
        expert_rule=np.array([rule_code(r["expert_rule"]) for r in records], dtype=np.int8),
        origin=np.array([ORIGINS.index(r["origin"]) for r in records], dtype=np.int8),
        parent=np.array([-1 if r["parent"] is None else r["parent"] for r in records], dtype=np.int32),
        load=np.array([[*(r.get("loadavg") or [np.nan] * 3), np.nan if r.get("runnable") is None
                        else r["runnable"]] for r in records], dtype=np.float32),
        feature_rows=rows, feature_index=index, feature_offsets=offsets,
        expert_features=expert.astype(np.float32), traces=[r["trace"] for r in records])
    save(pool, out)
    return (f"{out}: {n} candidates ({int(pool.measured().sum())} measured, best "
            f"{np.nanmin(pool.latency_us):.1f} us), {rows.shape[0]} distinct feature rows, "
            f"{os.path.getsize(out) / 1024:.0f} KiB")


def _measured_target(meta: dict):
    """The target a journal's candidates were drawn for: a GPU's where one is recorded (pools measured on a GPU by
    the GPU campaign), else this CPU's, as the collector uses."""
    import tvm

    from ...targets import resolve_target

    try:
        target = tvm.target.Target(json.loads(meta["target"]))
    except (KeyError, ValueError, TypeError, tvm.TVMError):
        return resolve_target("llvm")
    return target if not TargetInfo.of(target).is_cpu else resolve_target("llvm")


def save(pool: Pool, out: str) -> None:
    """Write ``pool`` (traces loaded) as a pool file, atomically."""
    from ...fileio import atomic_write

    if pool.traces is None:
        raise FusionExtError("saving a pool needs its traces (load(path, traces=True))")
    arrays = {
        "meta": _blob(json.dumps(pool.meta)), "latency_us": pool.latency_us, "run_us": pool.run_us,
        "status": pool.status, "expert_rule": pool.expert_rule, "origin": pool.origin, "parent": pool.parent,
        "load": pool.load, "feature_rows": pool.feature_rows, "feature_index": pool.feature_index,
        "feature_offsets": pool.feature_offsets, "expert_features": pool.expert_features,
        "traces": _blob(json.dumps(pool.traces, separators=(",", ":")), level=9),
    }
    for name in OPTIONAL_ARRAYS:
        if getattr(pool, name) is not None:
            arrays[name] = getattr(pool, name)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    atomic_write(out, lambda f: np.savez_compressed(f, **arrays), binary=True)


def _dedupe_rows(per_candidate):
    table: dict = {}
    rows, index, offsets = [], [], [0]
    for feats in per_candidate:
        arr = np.asarray(feats, dtype=np.float32).reshape(-1, 164) if len(feats) else np.zeros((0, 164), np.float32)
        for row in arr:
            key = row.tobytes()
            if key not in table:
                table[key] = len(rows)
                rows.append(row)
            index.append(table[key])
        offsets.append(len(index))
    width = len(rows[0]) if rows else 164
    return (np.stack(rows) if rows else np.zeros((0, width), np.float32), np.asarray(index, dtype=np.int32),
            np.asarray(offsets, dtype=np.int64))


def _blob(text: str, level: int = 6) -> np.ndarray:
    return np.frombuffer(zlib.compress(text.encode("utf-8"), level), dtype=np.uint8)


def _unblob(arr: np.ndarray):
    return json.loads(zlib.decompress(arr.tobytes()).decode("utf-8"))


# ----------------------------------------------------------------------------------------------- load

def load(path: str, traces: bool = False) -> Pool:
    """Read a pool file (``traces=True`` also decodes every candidate's trace)."""
    if not os.path.isfile(path):
        raise FusionExtError(f"pool file '{path}' does not exist")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
        meta = _unblob(data["meta"])
    except Exception as err:  # noqa: BLE001  (zip/zlib/JSON errors of a damaged file)
        raise FusionExtError(f"pool file '{path}' is not readable: {type(err).__name__}: {err}") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise FusionExtError(f"pool file '{path}' has format {meta.get('format_version')}, "
                             f"this code reads {FORMAT_VERSION}")
    return Pool(meta=meta, latency_us=data["latency_us"].astype(np.float64), run_us=data["run_us"],
                status=data["status"], expert_rule=data["expert_rule"], origin=data["origin"],
                parent=data["parent"], load=data["load"], feature_rows=data["feature_rows"],
                feature_index=data["feature_index"], feature_offsets=data["feature_offsets"],
                expert_features=data["expert_features"], traces=_unblob(data["traces"]) if traces else None,
                path=path, **{name: data[name] for name in OPTIONAL_ARRAYS if name in data})


def load_dir(directory: str) -> List[Pool]:
    files = sorted(f for f in os.listdir(directory) if f.endswith(".npz")) if os.path.isdir(directory) else []
    if not files:
        raise FusionExtError(f"no pool files (*.npz) in '{directory}'")
    return [load(os.path.join(directory, f)) for f in files]


def rule_code(rule: Optional[str]) -> int:
    """How ``expert_rule`` stores a verdict: 0 passes, else 1 + the rule's index in ``expert.RULES``."""
    from ...tune.expert import RULES

    return 0 if rule is None else 1 + list(RULES).index(rule)


def workload_of(pool: Pool, target=None):
    """``(target, module)``: the target the pool was measured on (or ``target``, to rebuild it for another) and
    its task's PrimFunc, on which every stored trace replays."""
    import tvm

    from ...tune.intrin_stub import stub_tensor_intrinsics
    from ...tune.spaces import register_custom_rules
    from .pool_tasks import get_task

    if target is None:
        try:
            target = tvm.target.Target(json.loads(pool.meta["target"]))
        except (KeyError, ValueError) as err:
            raise FusionExtError(f"pool meta has no usable target ({err})") from None
    register_custom_rules()
    with stub_tensor_intrinsics(TargetInfo.of(target).is_cpu):
        return target, get_task(pool.meta["task"], target).mod


def schedule_of(pool: Pool, i: int, mod):
    """Candidate ``i`` of ``pool`` (loaded with its traces) replayed on ``mod``, or a one-line error naming it."""
    from tvm import s_tir
    from tvm.s_tir.schedule import Trace

    sch = s_tir.Schedule(mod)
    try:
        Trace.apply_json_to_schedule(pool.traces[i], sch)
    except Exception as err:  # noqa: BLE001  (TVM raises its own errors; name the candidate)
        raise FusionExtError(f"pool {pool.name}: candidate {i}'s trace no longer applies to task "
                             f"'{pool.meta['task']}' ({str(err).strip().splitlines()[0]})") from None
    return sch


def describe(path: str) -> str:
    """One paragraph about a pool file or a collection directory."""
    if os.path.isdir(path):
        from .collect import latency_us, read_records

        recs = read_records(path)
        lat = [latency_us(r) for r in recs]
        ok = [v for v in lat if v is not None]
        return (f"{path}: {len(recs)} candidates, {len(ok)} measured, best {min(ok) if ok else float('nan'):.1f} us, "
                f"{sum(1 for r in recs if r['expert_rule'])} rejected by the expert rules")
    pool = load(path)
    lat = pool.latency_us[pool.measured()]
    m = pool.meta
    buf = io.StringIO()
    buf.write(f"{path}: {m['task']} / {m['space']} ({m['kernel']}), {len(pool)} candidates, {len(lat)} measured\n")
    buf.write(f"  latency us: best {lat.min():.1f}, median {np.median(lat):.1f}, worst {lat.max():.1f}\n")
    buf.write(f"  expert rules reject {int(pool.rejected().sum())}; origins "
              + ", ".join(f"{o} {int((pool.origin == i).sum())}" for i, o in enumerate(ORIGINS)) + "\n")
    buf.write(f"  machine {m['machine']}, TVM {m['tvm']}, collected {m['started']} .. {m.get('finished', '?')}\n")
    buf.write(f"  load (1-min average) median {np.nanmedian(pool.load[:, 0]):.2f}, max {np.nanmax(pool.load[:, 0]):.2f}")
    again = m.get("remeasured")
    if again:
        first = pool.first_latency_us[pool.measured()]
        buf.write(f"\n  re-measured {again['started']} .. {again['finished']}: {again['protocol']}; collected best "
                  f"{np.nanmin(first):.1f} us; load (1-min) at the rounds "
                  + ", ".join(f"{v:.2f}" for v in pool.rounds_load[:, 0]))
    return buf.getvalue()
