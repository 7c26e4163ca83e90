"""Whether one pool candidate is faster than another beyond the pool's own measurement noise.

The replay's strict measure compares the single latency a pool stores per candidate (the minimum over its
re-measurement rounds). On a shared 2-core machine two candidates 0.5 % apart can swap places between rounds:
BERT's FFN ``auto`` pool orders its three best candidates one way by the minimum of five rounds and the
opposite way by the collector's first measurement. So beside the strict share of seeds "at least as good as
random", the replay reports the share in which random's final best was not *shown* faster than the strategy's:
a one-sided Mann-Whitney U test on the two candidates' rounds (``rounds_us`` after ``pool remeasure``, else the
collector's repeats ``run_us``) at ``ALPHA``. The strict figure stays the goal's measure; this one says how
many of its losses the measurements can tell apart at all.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

ALPHA = 0.05
EXACT_LIMIT = 20_000      # enumerate every split up to this many; beyond, the normal approximation


def samples(pool, i: int) -> np.ndarray:
    """Candidate ``i``'s repeated timings (us), finite ones only."""
    rows = pool.rounds_us if pool.rounds_us is not None else pool.run_us
    values = np.asarray(rows[i], dtype=np.float64)
    return values[np.isfinite(values)]


def _u_fast(fast: np.ndarray, slow: np.ndarray) -> float:
    """Mann-Whitney U of ``fast`` against ``slow``: pairs where the fast sample is lower (ties count half)."""
    return float((fast[:, None] < slow[None, :]).sum() + 0.5 * (fast[:, None] == slow[None, :]).sum())


def p_faster(fast: np.ndarray, slow: np.ndarray) -> float:
    """One-sided p-value of "``fast`` is faster than ``slow``" (exact permutation distribution of U when the
    number of splits is small, as with a pool's 3 or 5 rounds; normal approximation otherwise)."""
    fast, slow = np.asarray(fast, np.float64), np.asarray(slow, np.float64)
    if fast.size == 0 or slow.size == 0:
        return 1.0
    observed = _u_fast(fast, slow)
    pooled = np.concatenate([fast, slow])
    n, total = fast.size, pooled.size
    if math.comb(total, n) <= EXACT_LIMIT:
        every = np.arange(total)
        stats = np.array([_u_fast(pooled[list(c)], np.delete(pooled, list(c)))
                          for c in itertools.combinations(every, n)])
        return float(np.mean(stats >= observed - 1e-9))
    m = slow.size
    mean, sd = n * m / 2.0, math.sqrt(n * m * (total + 1) / 12.0)
    return float(0.5 * math.erfc((observed - 0.5 - mean) / (sd * math.sqrt(2.0))))


def shown_faster(pool, fast: int, slow: int, alpha: float = ALPHA) -> bool:
    """Whether candidate ``fast`` is faster than candidate ``slow`` beyond the pool's measurement noise."""
    if fast == slow or not np.isfinite(pool.latency_us[fast]):
        return False
    if not np.isfinite(pool.latency_us[slow]):
        return True
    return p_faster(samples(pool, fast), samples(pool, slow)) < alpha
