"""How well did tuning go, per task: cost-model ranking quality and search convergence.

* ``spearman``: rank correlation between the XGBoost model's predicted score for a candidate (made before
  the model saw that candidate's measurement) and its measured throughput (1 / latency). MetaSchedule's
  model predicts a normalised throughput, so +1 means it ranks candidates perfectly. ``None`` with fewer
  than 3 predicted, successfully measured candidates (XGBModel returns random numbers before warm-up; those
  are not counted).
* ``trials_to_5pct``: how many measured trials the search needed to get within 5 % of the best latency it
  found (1-based, counting failed builds/runs): small = converged early, near ``trials`` = still improving.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np


def _ranks(x: Sequence[float]) -> np.ndarray:
    """Ranks with ties averaged (what Spearman's rho needs)."""
    x = np.asarray(x, dtype="float64")
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype="float64")
    ranks[order] = np.arange(1, len(x) + 1)
    for value in np.unique(x):
        tie = x == value
        if tie.sum() > 1:
            ranks[tie] = ranks[tie].mean()
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> Optional[float]:
    if len(a) != len(b) or len(a) < 3:
        return None
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def trials_to_within(latencies: Sequence[Optional[float]], tolerance: float = 0.05) -> Optional[int]:
    good = [lat for lat in latencies if lat is not None]
    if not good:
        return None
    target = min(good) * (1.0 + tolerance)
    for i, lat in enumerate(latencies):
        if lat is not None and lat <= target:
            return i + 1
    return None


def task_quality(history: List[Tuple[Optional[float], Optional[float]]]) -> dict:
    """``history``: (latency in s or None if the candidate failed, predicted score or None) in trial order."""
    pairs = [(pred, 1.0 / lat) for lat, pred in history if lat is not None and pred is not None]
    rho = spearman([p for p, _ in pairs], [t for _, t in pairs])
    return {"trials": len(history), "failed": sum(1 for lat, _ in history if lat is None),
            "predicted_pairs": len(pairs), "spearman": None if rho is None else round(rho, 4),
            "trials_to_5pct": trials_to_within([lat for lat, _ in history])}
