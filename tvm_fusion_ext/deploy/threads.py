"""Sizing TVM's CPU thread pool (a runtime concern: it needs ``tvm.runtime`` only)."""

from __future__ import annotations

import os
from typing import Optional

import tvm_ffi


def usable_cpus() -> list:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def configure_cpu_threads(num_threads: Optional[int] = None) -> int:
    """Give TVM's CPU thread pool one thread per usable core; returns the thread count in effect.

    TVM sizes its pool to half the logical CPUs (it assumes SMT siblings), which on a 2-vCPU VM is a single
    thread: every ``T.parallel`` loop then runs serially. The environment variable also reaches the
    processes MetaSchedule's runner spawns to measure candidates."""
    cpus = usable_cpus()
    n = max(1, min(int(num_threads or len(cpus)), len(cpus)))
    os.environ.setdefault("TVM_NUM_THREADS", str(n))
    current = int(tvm_ffi.get_global_func("runtime.NumThreads")())
    if current < n:
        # -3 = kSpecifyThreadShareAllCore: n workers free to run on any of these cores (no strict pinning,
        # which would hurt when other processes share the machine).
        tvm_ffi.get_global_func("runtime.config_threadpool")(-3, n, [str(c) for c in cpus])
        current = int(tvm_ffi.get_global_func("runtime.NumThreads")())
    return current
