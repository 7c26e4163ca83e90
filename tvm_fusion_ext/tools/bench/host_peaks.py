"""The host's peak per precision, measured in the same run as a benchmark: fp32 FMA, bf16 and int8 dot products
(the best instruction the CPU has: ``vdpbf16ps``, ``vpdpbusd``; AVX2's ``vpmaddwd`` for int8 without VNNI) and
copy bandwidth, by ``host_peaks.c`` built with the system's C compiler (``$CC``, else ``cc``) on first use and
cached. A benchmark reads each kernel's GFLOP/s (GOP/s) against the peak of the precision it computes in.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
from typing import Optional

SOURCE = pathlib.Path(__file__).with_name("host_peaks.c")
#: precision → the JSON field of its peak
PEAK_FIELD = {"fp32": "fp32_gflops", "bf16": "bf16_gflops", "int8": "int8_gops"}


def _binary() -> pathlib.Path:
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "tvm_fusion_ext"
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    exe = cache / f"host-peaks-{digest}"
    if exe.is_file():
        return exe
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or $CC) to build the peak measurement")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        built = pathlib.Path(tmp) / "host-peaks"
        res = subprocess.run([cc, "-O2", "-fopenmp", str(SOURCE), "-o", str(built)], capture_output=True, text=True,
                             timeout=120)
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"{cc} could not build the peak measurement: {last}")
        os.replace(built, exe)  # atomic: two benchmarks may build it at once
    return exe


def measure_peaks(threads: int) -> dict:
    """``{"threads", "fp32_gflops", "bf16_gflops", "int8_gops", "copy_gbs", "*_instruction"}`` on ``threads``
    threads (a few seconds), or ``{"error": one line}`` where it cannot be measured."""
    try:
        exe = _binary()
        res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, OMP_NUM_THREADS=str(int(threads))))
        if res.returncode not in (0, 1):  # 1: the anti-dead-code check's value, not a failure
            raise RuntimeError(f"the peak measurement exited with {res.returncode}")
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError, IndexError) as err:
        return {"error": str(err).splitlines()[0] if str(err) else type(err).__name__}


def peak_for(peaks: Optional[dict], precision: str) -> Optional[float]:
    """The peak (GFLOP/s or GOP/s) a kernel computing in ``precision`` is read against, if measured."""
    if not peaks or "error" in peaks:
        return None
    value = peaks.get(PEAK_FIELD.get(precision, ""))
    return float(value) if value else None


def describe_peaks(peaks: dict) -> str:
    """One line for the benchmark's output."""
    if "error" in peaks:
        return f"host peaks: not measured ({peaks['error']})"
    return (f"host peaks, {peaks['threads']} threads, measured now: fp32 {peaks['fp32_gflops']:.0f} GFLOP/s "
            f"({peaks['fp32_instruction']}), bf16 {peaks['bf16_gflops']:.0f} GFLOP/s ({peaks['bf16_instruction']}), "
            f"int8 {peaks['int8_gops']:.0f} GOP/s ({peaks['int8_instruction']}), copy {peaks['copy_gbs']:.1f} GB/s")
