"""Knob features: a schedule's sampling decisions, read from its trace, as one fixed-width row.

A candidate of a template (ours, or one MetaSchedule sketch) is its decisions: which tile factors, which
categorical choice, where a block is computed. ``PerStoreFeature`` describes the code those decisions
produce (loop extents, memory traffic) summed over stores, which blurs what was chosen; AutoTVM's knob
features described the choice itself. On the re-measured template pools a ranking model that also sees the
decisions needs a third fewer trials than one that sees the store features only (docs/tuning-lab.md, replay table).

Columns follow the trace's sample instructions in order: a categorical choice gives the log2 of the chosen
value, a perfect or partitioned tile the log2 of each factor, a compute location its index. Candidates of one
template line up column by column (the same instructions in the same order); candidates of different
sketches do not, which is harmless for a tree model that also sees the store features. Rows are padded
with NaN (xgboost's missing value) to ``WIDTH``; longer decision lists are cut.
"""

from __future__ import annotations

import math
from typing import List, Sequence

import numpy as np

WIDTH = 24


def _log2(v) -> float:
    v = float(v)
    return math.log2(v) if v > 0 else v


def knob_values(trace: Sequence) -> List[float]:
    """The decisions of a trace in MetaSchedule JSON form (``[instructions, decisions]``)."""
    insts, decisions = trace[0], trace[1] if len(trace) > 1 else []
    chosen = {int(i): d for i, d in decisions}
    out: List[float] = []
    for i, inst in enumerate(insts):
        kind = inst[0]
        if i not in chosen:
            continue
        d = chosen[i]
        if kind == "SampleCategorical":
            candidates = inst[2][0]
            out.append(_log2(candidates[int(d)]) if 0 <= int(d) < len(candidates) else float(d))
        elif kind in ("SamplePerfectTile", "SamplePartitionedTile"):
            out.extend(_log2(f) for f in d)
        elif kind == "SampleComputeLocation":
            out.append(float(d))
    return out


def trace_json(trace) -> list:
    """The trace as plain JSON (``Trace.as_json`` leaves IntImm/FloatImm attributes in it)."""
    import tvm

    def plain(obj):
        if isinstance(obj, (list, tuple)):
            return [plain(o) for o in obj]
        if isinstance(obj, dict):
            return {str(k): plain(v) for k, v in obj.items()}
        if isinstance(obj, tvm.tirx.IntImm):
            return int(obj.value)
        if isinstance(obj, tvm.tirx.FloatImm):
            return float(obj.value)
        return obj

    return plain(trace.as_json())


def knob_row(trace: Sequence) -> np.ndarray:
    row = np.full(WIDTH, np.nan, np.float32)
    values = knob_values(trace)[:WIDTH]
    row[:len(values)] = values
    return row


def knob_rows(traces: Sequence) -> np.ndarray:
    return np.stack([knob_row(t) for t in traces]) if len(traces) else np.zeros((0, WIDTH), np.float32)
