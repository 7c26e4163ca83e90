"""What a decode step can reach at best: the bytes it must stream, and the host's read bandwidth measured now.

A decode step (one new token per sequence) does a few flops per byte: it is bound by memory, every weight read
once per step and every cached key and value once. Its limit is ``(weight bytes + cache bytes) / read
bandwidth``. The bandwidth is measured in the same run as the step (a shared machine's bandwidth moves with its
load): numpy's fp32 matrix-vector product over a matrix far larger than the last-level cache, on BLAS's threads,
is a read stream (the vector and the result stay in cache).
"""

from __future__ import annotations

import os
import time
from typing import Dict, Optional

import numpy as np

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


def read_bandwidth(repeat: int = 10) -> Dict[str, float]:
    """``{"gb_per_s", "median_gb_per_s", "bytes", "best_ms", "median_ms", "llc_bytes"}``: ``repeat`` fp32 GEMVs
    (after one warm-up) over a matrix of ``max(8 × LLC, 256 MiB)`` (capped at 1 GiB), in 10^9 bytes per second.
    ``gb_per_s`` is the best call's, as STREAM reports: other processes only ever slow a call down, so the best
    is the closest to what the memory gives (the median is kept beside it)."""
    llc = last_level_cache_bytes()
    size = min(max(LLC_MULTIPLE * (llc or 0), MIN_STREAM_BYTES), MAX_STREAM_BYTES)
    cols = 4096
    rows = size // (4 * cols)
    matrix = np.ones((rows, cols), np.float32)  # written once: every page is mapped before timing
    vector = np.ones(cols, np.float32)
    matrix @ vector
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        matrix @ vector
        samples.append(time.perf_counter() - start)
    median, best = float(np.median(samples)), float(min(samples))
    return {"gb_per_s": matrix.nbytes / best / 1e9, "median_gb_per_s": matrix.nbytes / median / 1e9,
            "bytes": int(matrix.nbytes), "best_ms": best * 1e3, "median_ms": median * 1e3, "llc_bytes": llc,
            "method": "numpy fp32 GEMV, best of %d" % repeat}


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
