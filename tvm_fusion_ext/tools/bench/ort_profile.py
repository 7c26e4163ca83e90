"""Where ONNX Runtime's call goes: its own profiler, summed per operator type.

``bench --kernels`` prints where our call spends its time; a reader comparing two runtimes needs the peer's side
too, measured the same way and in the same run: which of ORT's operators cost what, and so what is left once both
runtimes pay for their matrix products. ORT's profiler (``SessionOptions.enable_profiling``) times every node;
this module runs a second session with it on (same threads, same spinning, same inputs as the timed one), keeps the
node events of the calls after the warm-up, and reports per operator type the median over calls of its summed time.

The profiler adds to each node (MiniLM's profiled call was 3 % slower than the timed one at (8, 128), 14 % at
(1, 128): many short nodes), so these figures are for the split, not for the ratio: the ratio comes from the
timed, unprofiled calls of the benchmark table.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

import numpy as np


@dataclass
class OpTime:
    op: str      # ONNX operator type (contrib ops by their own name: FusedMatMul, BiasGelu, ...)
    nodes: int   # nodes of that type that ran in one call
    ms: float    # median over the profiled calls of their summed time


@dataclass
class OrtProfile:
    ops: List[OpTime]        # slowest first
    profiled_ms: float       # median profiled call (ORT's model_run event)
    runs: int

    @property
    def ops_ms(self) -> float:
        return sum(o.ms for o in self.ops)

    def to_dict(self) -> dict:
        total = self.ops_ms
        return {"profiled_call_ms": self.profiled_ms, "ops_ms": total, "runs": self.runs,
                "ops": [{"op": o.op, "nodes": o.nodes, "ms": o.ms, "share": o.ms / total if total > 0 else None}
                        for o in self.ops]}

    def table(self, top: int = 12) -> str:
        total = self.ops_ms
        shown = self.ops[:top]
        rest = self.ops[top:]
        if rest:
            shown = shown + [OpTime(f"{len(rest)} other operator types", sum(o.nodes for o in rest),
                                    sum(o.ms for o in rest))]
        lines = ["| operator | nodes | ms | share |", "|---|---|---|---|"]
        for o in shown:
            lines.append(f"| {o.op} | {o.nodes} | {o.ms:.3f} | {o.ms / total * 100 if total else 0:.1f} % |")
        lines.append(f"operators {total:.2f} ms per call (median of {self.runs} profiled calls: "
                     f"{self.profiled_ms:.2f} ms with ORT's profiler on)")
        return "\n".join(lines)


def summarize(events: List[dict], warmup: int) -> OrtProfile:
    """An :class:`OrtProfile` from the events of ORT's profile file; the first ``warmup`` calls are dropped."""
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])[warmup:]
    if not runs:
        raise ValueError(f"ONNX Runtime's profile holds no call after the {warmup} warm-up calls")
    starts = [r["ts"] for r in runs]
    per_run: List[Dict[str, float]] = [{} for _ in runs]
    nodes: Dict[str, set] = {}
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        i = int(np.searchsorted(starts, e["ts"], side="right")) - 1
        if i < 0 or e["ts"] > runs[i]["ts"] + runs[i]["dur"]:
            continue  # outside the kept calls: a warm-up call's, or after a call ended
        op = (e.get("args") or {}).get("op_name") or "?"
        per_run[i][op] = per_run[i].get(op, 0.0) + e["dur"] / 1e3
        nodes.setdefault(op, set()).add(e["name"])
    ops = [OpTime(op, len(names), float(np.median([r.get(op, 0.0) for r in per_run]))) for op, names in nodes.items()]
    ops.sort(key=lambda o: -o.ms)
    return OrtProfile(ops, float(np.median([r["dur"] / 1e3 for r in runs])), len(runs))


def profile_ort(path: str, feeds: Mapping[str, np.ndarray], threads: Optional[int], spin: bool, runs: int = 10,
                warmup: int = 2) -> OrtProfile:
    """ONNX Runtime's call on ``feeds`` (by input name; inputs the session lacks are left out), profiled
    ``runs`` times after ``warmup`` calls, in a session built as the benchmark's (:func:`.peers.ort_session`)."""
    from .peers import ort_session

    if runs <= 0:
        raise ValueError(f"profile_ort: runs must be positive, got {runs}")
    with tempfile.TemporaryDirectory(prefix="tfx-ort-profile-") as tmp:
        sess = ort_session(path, threads, spin=spin, profile_prefix=os.path.join(tmp, "ort"))
        names = {i.name for i in sess.get_inputs()}
        given = {k: v for k, v in feeds.items() if k in names}
        for _ in range(warmup + runs):
            sess.run(None, given)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    return summarize(events, warmup)
