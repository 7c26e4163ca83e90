"""Helpers shared by the CPU templates."""

from __future__ import annotations

import os

import tvm


def num_cores(target: tvm.target.Target) -> int:
    """The target's ``num-cores``, else this machine's."""
    n = target.attrs.get("num-cores") if target.attrs is not None else None
    return int(n) if n is not None and int(n) > 0 else (os.cpu_count() or 1)


def vector_lanes(target: tvm.target.Target, dtype_bits: int = 32) -> int:
    """fp32 lanes of the target's widest vector unit (AVX-512: 16, AVX2/others: 8)."""
    mcpu = str(target.attrs.get("mcpu", "")) if target.attrs is not None else ""
    wide = any(tag in mcpu for tag in ("skylake-avx512", "cascadelake", "icelake", "sapphirerapids", "znver4",
                                       "znver5", "cooperlake", "tigerlake"))
    return (512 if wide else 256) // dtype_bits
