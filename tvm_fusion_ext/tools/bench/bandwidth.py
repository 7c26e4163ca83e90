"""What a decode step can reach at best: the bytes it must stream, and the host's read bandwidth measured now.

A decode step (one new token per sequence) does a few flops per byte: it is bound by memory, every weight read
once per step and every cached key and value once. Its limit is ``(weight bytes + cache bytes) / read
bandwidth``. The bandwidth is measured in the same run as the step (a shared machine's bandwidth moves with its
load): numpy's fp32 matrix-vector product over a matrix far larger than the last-level cache, on BLAS's threads,
is a read stream (the vector and the result stay in cache). :func:`time_beside_bandwidth` interleaves it with the
step's calls, so both are measured in the same seconds.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Dict, Optional

import numpy as np

from ..timing import Timing

#: the GEMV matrix is at least this many times the last-level cache, and at least ``MIN_STREAM_BYTES``
LLC_MULTIPLE, MIN_STREAM_BYTES, MAX_STREAM_BYTES = 8, 256 << 20, 1 << 30


def last_level_cache_bytes() -> Optional[int]:
    """The largest CPU cache sysfs reports for cpu0 (the L3 on x86), or None."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    best = None
    try:
        entries = os.listdir(base)
    except OSError:
        return None
    for entry in entries:
        try:
            with open(os.path.join(base, entry, "size")) as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        try:
            size = int(text.rstrip("KMGkmg")) * scale
        except ValueError:
            continue
        best = size if best is None else max(best, size)
    return best


class ReadStream:
    """The host's read stream: numpy's fp32 GEMV over a matrix of ``max(8 × LLC, 256 MiB)`` (capped at 1 GiB),
    allocated, touched and called once here, then timed as often as asked."""

    def __init__(self):
        self.llc = last_level_cache_bytes()
        size = min(max(LLC_MULTIPLE * (self.llc or 0), MIN_STREAM_BYTES), MAX_STREAM_BYTES)
        cols = 4096
        self.matrix = np.ones((size // (4 * cols), cols), np.float32)  # written once: every page mapped
        self.vector = np.ones(cols, np.float32)
        self.matrix @ self.vector

    def seconds(self) -> float:
        start = time.perf_counter()
        self.matrix @ self.vector
        return time.perf_counter() - start

    def summary(self, samples, method: str) -> Dict[str, float]:
        """``{"gb_per_s", "median_gb_per_s", "best_gb_per_s", "bytes", "best_ms", "median_ms", "llc_bytes",
        "method"}`` of ``samples`` (seconds), in 10^9 bytes per second; ``gb_per_s`` is the median's."""
        best, median = float(min(samples)), float(np.median(samples))
        return {"gb_per_s": self.matrix.nbytes / median / 1e9, "median_gb_per_s": self.matrix.nbytes / median / 1e9,
                "best_gb_per_s": self.matrix.nbytes / best / 1e9, "bytes": int(self.matrix.nbytes),
                "best_ms": best * 1e3, "median_ms": median * 1e3, "llc_bytes": self.llc, "method": method}


#: BLAS's worker threads keep spinning for tens of milliseconds after a call, and a runtime's may too: a decode
#: step started right after a numpy GEMV took twice its time for 60-80 ms (2-core Zen 3 VM), so each block of
#: :func:`time_beside_bandwidth` starts after this pause
SETTLE_SECONDS = 0.15


def time_beside_bandwidth(name: str, call: Callable[[], object], repeat: int, rounds: int = 4, gemvs: int = 4,
                          stream: Optional[ReadStream] = None, max_seconds: float = 20.0):
    """``(Timing, bandwidth)``: ``call`` timed ``repeat`` times in ``rounds`` blocks, each block after a block of
    ``gemvs`` GEMVs, so that the step and the bandwidth it is divided by are measured in the same seconds and by
    the same statistic: ``bandwidth["gb_per_s"]`` is the GEMVs' median, as the step's figure is its calls'
    median. A shared host's bandwidth moves by half within minutes (numpy's GEMV read 28-45 GB/s across ten runs
    of an hour on a 2-core VM), and a best call catches the quietest moment of a busy host where a median does
    not: measured once, or as a best, the limit was a quiet moment's against a busy moment's step.
    ``best_gb_per_s`` (the fastest GEMV, STREAM's figure) and ``rounds_gb_per_s`` (each block's median) are kept
    beside it. Each block of calls begins with one untimed call, after :data:`SETTLE_SECONDS`. As
    :func:`~..timing.time_block`, the timing stops early after ``max_seconds`` once each block has a call."""
    stream = stream or ReadStream()
    rounds = max(1, min(rounds, repeat))
    call()
    samples, gemv, blocks = [], [], []
    budget_end = time.perf_counter() + max_seconds
    for r in range(rounds):
        time.sleep(SETTLE_SECONDS)
        block = [stream.seconds() for _ in range(gemvs)]
        gemv += block
        blocks.append(float(np.median(block)))
        time.sleep(SETTLE_SECONDS)
        call()
        for k in range(repeat // rounds + (r < repeat % rounds)):
            if k and time.perf_counter() > budget_end:
                break
            start = time.perf_counter()
            call()
            samples.append((time.perf_counter() - start) * 1e3)
    host = stream.summary(gemv, f"numpy fp32 GEMV, median of {len(gemv)} in {rounds} blocks between the step's")
    host["rounds_gb_per_s"] = [stream.matrix.nbytes / b / 1e9 for b in blocks]
    return Timing(name, samples), host


def streamed_weight_bytes(path: str, batch: int) -> Dict[str, int]:
    """``{"weights": bytes a step reads, "tables": bytes of lookup tables, "table_rows_read": bytes of their rows
    read}`` for an ONNX file. A table only gathered from (the token embedding) is read a row per token, not
    whole; every other initializer (and every Constant tensor over 1 KiB) is read whole once per step."""
    import onnx

    proto = onnx.load(path, load_external_data=False)
    graph = proto.graph
    sizes = {}
    for t in graph.initializer:
        sizes[t.name] = _tensor_bytes(t, onnx)
    for n in graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and _tensor_bytes(a.t, onnx) > 1024:
                    sizes[n.output[0]] = _tensor_bytes(a.t, onnx)
    readers: Dict[str, set] = {}
    for n in graph.node:
        for k, name in enumerate(n.input):
            if name in sizes:
                readers.setdefault(name, set()).add((n.op_type, k))
    tables = {name for name, r in readers.items() if r == {("Gather", 0)}}
    weights = sum(s for name, s in sizes.items() if name not in tables)
    table_bytes = sum(sizes[t] for t in tables)
    row_bytes = 0
    for t in tables:
        tensor = next((x for x in graph.initializer if x.name == t), None)
        dims = list(tensor.dims) if tensor is not None else []
        if dims:
            row_bytes += batch * sizes[t] // max(int(dims[0]), 1)
    return {"weights": int(weights), "tables": int(table_bytes), "table_rows_read": int(row_bytes)}


def _tensor_bytes(t, onnx) -> int:
    count = 1
    for d in t.dims:
        count *= int(d)
    return count * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
