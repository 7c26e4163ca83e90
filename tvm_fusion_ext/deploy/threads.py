"""Sizing TVM's CPU thread pool (a runtime concern: it needs ``tvm.runtime`` only)."""

from __future__ import annotations

import os
from typing import Optional

import tvm_ffi

#: How many times an idle pool worker calls ``sched_yield`` before it sleeps (``TVM_THREAD_POOL_SPIN_COUNT``), unless
#: the environment says otherwise. A model call is a chain of parallel kernels a few microseconds apart; a worker
#: that slept between two of them must be woken, and on a VM a halted vCPU takes tens of microseconds to wake. Kept
#: awake, it picks the next kernel up at once: measured on the 2-core VM (all-MiniLM-L6-v2 artifact, separate
#: processes, three runs each), 2.14 against 2.73 ms at (1, 16) and 14.2 against 16.2 ms at (1, 128). A yield gives
#: the core to any other runnable thread, so unlike a busy-wait it does not starve a loaded machine; 1,000 yields
#: take about 0.2 ms here, after which an idle worker sleeps (TVM's own default, 300,000, keeps it yielding ~70 ms).
SHORT_SPIN_COUNT = 1000


def usable_cpus() -> list:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def configure_cpu_threads(num_threads: Optional[int] = None) -> int:
    """Give TVM's CPU thread pool one thread per usable core; returns the thread count in effect.

    TVM sizes its pool to half the logical CPUs (it assumes SMT siblings), which on a 2-vCPU VM is a single
    thread: every ``T.parallel`` loop then runs serially. The environment variables also reach the
    processes MetaSchedule's runner spawns to measure candidates.

    Idle workers yield :data:`SHORT_SPIN_COUNT` times before sleeping. TVM reads that count once, when its
    pool's first worker starts, so it applies only if this runs before anything in the process used the pool."""
    import tvm  # noqa: F401  (loads the library that registers runtime.NumThreads; runtime-only is enough)

    cpus = usable_cpus()
    n = max(1, min(int(num_threads or len(cpus)), len(cpus)))
    os.environ.setdefault("TVM_NUM_THREADS", str(n))
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", str(SHORT_SPIN_COUNT))  # before the pool exists
    current = int(tvm_ffi.get_global_func("runtime.NumThreads")())
    if current < n:
        # -3 = kSpecifyThreadShareAllCore: n workers free to run on any of these cores (no strict pinning,
        # which would hurt when other processes share the machine).
        tvm_ffi.get_global_func("runtime.config_threadpool")(-3, n, [str(c) for c in cpus])
        current = int(tvm_ffi.get_global_func("runtime.NumThreads")())
    return current
