"""Re-measure a pool's candidates in one process, interleaved, so that a shared machine's load is noise and
not signal.

``python -m tvm_fusion_ext.tools.tuning_lab pool remeasure tuning_pools/minilm-ffn-template.npz [--rounds 5]``

Why: the collector measures each candidate once, minutes apart from the others, in a fresh runner process.
On a shared 2-core machine the load moved between 2 and 10 runnable processes during a collection, and the
collected latency followed it (Spearman ρ between a candidate's latency and the runnable count when it was
measured: 0.42 on the attention pool, 0.58 on the FFN pool, more than any cost-model feature reached). A
replay over such a pool rewards the candidates that happened to be measured in a quiet minute, which no
model can predict.

How: every candidate is rebuilt from its stored trace (postprocessors included) and loaded into this
process; then ``rounds`` times, in a fresh random order each round, each candidate is timed once (TVM's
``time_evaluator``, one warm-up call, then as many calls as fill ``min_repeat_ms``) with one thread per core
as the tuner measures. A burst of load now hits a few calls of many candidates instead of every call of a
few, and the **minimum over rounds** (interference only ever slows a kernel down) becomes the candidate's
``latency_us``. The collector's figure stays in ``first_latency_us``, all rounds in ``rounds_us``, and the
load at each round in ``rounds_load``; the meta records the protocol.

``--target llvm`` re-targets a pool to this machine's CPU: the traces are rebuilt for it and timed here, and the
file then describes this machine (its target, the expert rules' verdicts and expert features for it; the old
target is kept in ``meta["retargeted"]``). Why: a pool is a ``--warm-start`` source only for runs on its own
target (``pool records``), and the shipped pools were measured on another CPU. The candidates stay the ones
drawn from the old target's design space, so they are a transfer source here, not a sample of this CPU's
space.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Callable, Optional

import numpy as np

from ...errors import FusionExtError
from ...targets import TargetInfo

BUILD_BATCH = 32


def remeasure(path: str, out: Optional[str] = None, rounds: int = 5, min_repeat_ms: int = 10,
              threads: Optional[int] = None, seed: int = 0, say: Callable[[str], None] = print,
              target: Optional[str] = None) -> str:
    """Re-measure pool file ``path`` into ``out`` (default: in place), rebuilt for ``target`` when given (a
    target spec: ``llvm`` is this CPU); returns a one-line summary."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from ...tune.intrin_stub import skip_tensor_intrin
    from .collect import machine_info, machine_load
    from .pool_file import load, save, workload_of

    if rounds < 1:
        raise FusionExtError(f"--rounds must be at least 1, got {rounds}")
    pool = load(path, traces=True)
    pool_target, mod = workload_of(pool)
    retarget = _retarget(pool, pool_target, target)
    if retarget is not None:
        target, mod = workload_of(pool, retarget)
    else:
        target = pool_target
    cores = _set_threads(threads or int(target.attrs.get("num-cores") or 0) or None)
    todo = np.flatnonzero(pool.status == 0)
    started = time.strftime("%Y-%m-%dT%H:%M:%S")

    libs, failed = _build_all(pool, mod, target, todo, say, skip_tensor_intrin)
    dev = tvm.cpu()
    args = _arguments(mod, dev, ms)
    rng = np.random.default_rng(seed)
    rounds_us = np.full((len(pool), rounds), np.nan, dtype=np.float32)
    rounds_load = np.full((rounds, 4), np.nan, dtype=np.float32)
    ready = np.asarray(sorted(libs), dtype=np.int64)
    for r in range(rounds):
        load_now = machine_load()
        rounds_load[r] = [*load_now["loadavg"], np.nan if load_now["runnable"] is None else load_now["runnable"]]
        start = time.time()
        for i in rng.permutation(ready):
            lib = libs[int(i)]
            timer = lib.time_evaluator(lib.entry_name, dev, number=1, repeat=1, min_repeat_ms=int(min_repeat_ms))
            rounds_us[i, r] = float(timer(*args).mean) * 1e6
        say(f"remeasure: {pool.name} round {r + 1}/{rounds}: {len(ready)} candidates in {time.time() - start:.0f} s,"
            f" load {load_now['loadavg'][0]:.2f}")

    first = pool.first_latency_us if pool.first_latency_us is not None else pool.latency_us.copy()
    # every round times every rebuilt candidate: a row is all times or (not rebuilt) all NaN
    latency = rounds_us.min(axis=1).astype(np.float64)
    status = pool.status.copy()
    status[failed] = 1
    meta = dict(pool.meta)
    meta["remeasured"] = {
        "protocol": (f"one process, candidates rebuilt from their traces; {rounds} rounds in a fresh random order, "
                     f"time_evaluator(number=1, repeat=1, min_repeat_ms={min_repeat_ms}) per candidate and "
                     f"round, {cores} thread(s); latency_us = minimum over rounds"),
        "threads": cores, "rounds": rounds, "min_repeat_ms": min_repeat_ms, "seed": seed, "started": started,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine_info(),
        "rebuild_failed": [int(i) for i in failed],
    }
    if retarget is not None:
        from ...records import target_label

        meta["retargeted"] = {"from_target": meta["target"], "from_target_label": meta.get("target_label"),
                              "from_machine": meta.get("machine")}
        meta.update(target=str(target), target_label=target_label(target), machine=machine_info())
        pool.expert_rule = _verdicts(pool, mod, target)
    pool.meta, pool.latency_us, pool.status = meta, latency, status
    pool.first_latency_us, pool.rounds_us, pool.rounds_load = first, rounds_us, rounds_load
    target_path = out or path
    save(pool, target_path)
    if retarget is not None:
        from .pool_refeature import refeature

        say(refeature(target_path, say=say))
    ok = np.isfinite(latency)
    return (f"{target_path}: {int(ok.sum())} of {len(pool)} candidates re-measured in {rounds} rounds, best "
            f"{np.nanmin(latency):.1f} us (collected best {np.nanmin(first):.1f} us)")


def _retarget(pool, pool_target, spec: Optional[str]):
    """The target ``spec`` names when it is another than the pool's, else None."""
    from ...records import target_label
    from ...targets import resolve_target

    if spec is None:
        return None
    target = resolve_target(spec)
    if TargetInfo.of(target).kind != TargetInfo.of(pool_target).kind:
        raise FusionExtError(f"pool {pool.name} was measured on {TargetInfo.of(pool_target).kind}; it cannot be "
                             f"re-targeted to {TargetInfo.of(target).kind} (remeasure times CPU kernels)")
    return None if target_label(target) == target_label(pool_target) else target


def _verdicts(pool, mod, target) -> np.ndarray:
    """The expert rules' verdict on every candidate for ``target``, coded as the pool file stores them."""
    from ...tune.expert import check
    from .collect import expert_verdict
    from .pool_file import rule_code, schedule_of

    return np.array([rule_code(expert_verdict(check, schedule_of(pool, i, mod), target)) for i in range(len(pool))],
                    dtype=np.int8)


def _set_threads(n: Optional[int]) -> int:
    """Size TVM's thread pool to ``n`` (default: one per usable core), shrinking it if need be."""
    import tvm_ffi

    from ...deploy.threads import usable_cpus

    cpus = usable_cpus()
    n = max(1, min(int(n or len(cpus)), len(cpus)))
    tvm_ffi.get_global_func("runtime.config_threadpool")(-3, n, [str(c) for c in cpus])
    got = int(tvm_ffi.get_global_func("runtime.NumThreads")())
    if got != n:
        raise FusionExtError(f"could not size TVM's thread pool to {n} threads (it has {got})")
    return got


def _build_all(pool, mod, target, todo, say, initializer):
    """``{index: loaded runtime module}`` for every candidate in ``todo`` that still builds, and the others."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from .pool_file import schedule_of

    builder = ms.builder.LocalBuilder(max_workers=2, timeout_sec=300, initializer=initializer)
    libs, failed = {}, []
    start = time.time()
    for lo in range(0, len(todo), BUILD_BATCH):
        batch = [int(i) for i in todo[lo:lo + BUILD_BATCH]]
        mods = [schedule_of(pool, i, mod).mod for i in batch]
        for i, res in zip(batch, builder.build([ms.builder.BuilderInput(m, target) for m in mods])):
            if res.error_msg is not None:
                failed.append(i)
                continue
            libs[i] = tvm.runtime.load_module(res.artifact_path)
            shutil.rmtree(os.path.dirname(str(res.artifact_path)), ignore_errors=True)
        done = min(lo + BUILD_BATCH, len(todo))
        say(f"remeasure: {pool.name} built {done}/{len(todo)} ({(time.time() - start) / done:.2f} s each)")
    return libs, failed


def _arguments(mod, dev, ms):
    import tvm

    rng = np.random.default_rng(7)
    out = []
    for info in ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True):
        shape, dtype = [int(s) for s in info.shape], str(info.dtype)
        if dtype.startswith("float"):
            arr = rng.uniform(-1, 1, shape).astype(dtype)
        else:
            arr = np.zeros(shape, dtype)
        out.append(tvm.runtime.tensor(arr, dev))
    return out
