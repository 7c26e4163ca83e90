"""Same-run latency measurement that is fair on a 2-core machine.

ONNX Runtime and torch keep worker threads spinning after a call; interleaving runtimes call by call makes
each one pay for the other's spinning threads. So each runtime is timed in its own block of calls, after its
own warm-up, and we report medians and the p10–p90 spread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, List

import numpy as np


@dataclass
class Timing:
    name: str
    samples_ms: List[float]

    @property
    def median(self) -> float:
        return float(np.median(self.samples_ms))

    @property
    def p10(self) -> float:
        return float(np.percentile(self.samples_ms, 10))

    @property
    def p90(self) -> float:
        return float(np.percentile(self.samples_ms, 90))

    def to_dict(self) -> dict:
        return {"name": self.name, "median_ms": self.median, "p10_ms": self.p10, "p90_ms": self.p90,
                "runs": len(self.samples_ms)}


def time_block(name: str, call: Callable[[], object], warmup: int = 3, repeat: int = 20,
               max_seconds: float = 20.0) -> Timing:
    """Time ``call`` ``repeat`` times after ``warmup`` calls; stops early after ``max_seconds`` of timing."""
    for _ in range(warmup):
        call()
    samples = []
    budget_end = time.perf_counter() + max_seconds
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1e3)
        if time.perf_counter() > budget_end and len(samples) >= 3:
            break
    return Timing(name, samples)
