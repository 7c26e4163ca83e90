"""Target specs users type (``llvm``, ``cuda``, ``cuda:sm_90``) → complete TVM targets.

TVM 0.27 refuses string targets like ``"cuda -arch=sm_90"``, and a CUDA target built from a bare dict lacks
the limits (shared memory, threads, registers) that templates and MetaSchedule's ``VerifyGPUCode`` read.
Everything that needs a target goes through :func:`resolve_target`, so limits are data, in one place.
"""

from __future__ import annotations

import os
import re
from typing import Union

import tvm

from .errors import TargetError

# Per-block limits by architecture family (CUDA programming guide, "Technical Specifications"): the static
# shared-memory limit is 48 KiB on every arch; larger tiles need dynamic shared memory (opt-in, per arch).
_CUDA_LIMITS = {
    "max_shared_memory_per_block": 49152,
    "max_threads_per_block": 1024,
    "thread_warp_size": 32,
    "registers_per_block": 65536,
}
_CUDA_ARCH = re.compile(r"^sm_(\d{2,3})a?$")

TargetSpec = Union[str, dict, tvm.target.Target, None]


def host_cpu_target(num_cores: int | None = None) -> tvm.target.Target:
    """The machine we run on: its LLVM CPU name (AVX2/AVX-512 codegen) and its core count."""
    from tvm.target import codegen

    if num_cores is None:
        num_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = num_cores
    return tvm.target.Target({"kind": "llvm", "mcpu": str(codegen.llvm_get_system_cpu()), "num-cores": int(cores)})


def cuda_target(arch: str = "sm_90") -> tvm.target.Target:
    if not _CUDA_ARCH.match(arch):
        raise TargetError(f"unknown CUDA architecture '{arch}' (expected e.g. sm_80 or sm_90)")
    return tvm.target.Target({"kind": "cuda", "arch": arch, **_CUDA_LIMITS}, host=host_cpu_target())


def resolve_target(spec: TargetSpec = None) -> tvm.target.Target:
    """``None``/"llvm"/"cpu" → this CPU; "cuda"/"cuda:sm_XX" → CUDA; dicts and Targets pass through (completed)."""
    if spec is None:
        return host_cpu_target()
    if isinstance(spec, tvm.target.Target):
        return _complete(spec)
    if isinstance(spec, dict):
        try:
            return _complete(tvm.target.Target(spec))
        except Exception as err:  # noqa: BLE001  (TVM raises several types for a bad dict)
            raise TargetError(f"invalid target {spec}: {str(err).splitlines()[0]}") from None
    text = str(spec).strip()
    if text in ("llvm", "cpu"):
        return host_cpu_target()
    if text == "cuda":
        dev = tvm.cuda(0)  # the local GPU's architecture when there is one
        return cuda_target("sm_" + str(dev.compute_version).replace(".", "") if dev.exist else "sm_90")
    if text.startswith("cuda:"):
        return cuda_target(text.split(":", 1)[1])
    if "/" in text:  # a TVM tag such as "nvidia/nvidia-h100"
        try:
            return _complete(tvm.target.Target(text, host=host_cpu_target()))
        except Exception:  # noqa: BLE001
            pass
    raise TargetError(f"unknown target '{text}' (use llvm, cuda or cuda:sm_80 / cuda:sm_90)")


def _complete(target: tvm.target.Target) -> tvm.target.Target:
    if target.kind.name == "cuda":
        missing = {k: v for k, v in _CUDA_LIMITS.items() if target.attrs.get(k) is None}
        if missing or target.host is None:
            cfg = dict(target.export())
            cfg.pop("host", None)
            cfg.update(missing)
            return tvm.target.Target(cfg, host=target.host or host_cpu_target())
    return target


def is_cuda(target: tvm.target.Target) -> bool:
    return target.kind.name == "cuda"
