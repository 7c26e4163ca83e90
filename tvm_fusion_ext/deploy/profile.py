"""Where a model's call spends its time: each compiled kernel timed inside the Relax VM.

``profile_kernels(model, inputs)`` runs ``model`` (a loaded artifact, or a model built in this process) on a VM of
its own with an instrument around every function the VM calls, and returns each kernel's share of one call. It
needs TVM's runtime and numpy only, so it runs where the artifact is deployed: the machine whose caches, cores and
neighbours set the numbers.

What it measures, and what it cannot:

* A kernel's time is the wall time of its call on this thread, which waits for the parallel region to finish: the
  time the call costs the request. CPU kernels run synchronously; on a GPU the device is synchronised around each
  kernel (so launch overlap is lost, and the sum exceeds an ordinary call).
* The instrument is a Python callback, a few microseconds per VM call. Kernels of a few hundred microseconds read
  true; the VM's own bookkeeping (allocations, shape checks) is summed into one row, where that cost dominates. The
  un-instrumented call is timed too, interleaved, so a reader sees how much the profile adds.
* fp32 dense kernels are given a GFLOP/s figure from their arguments (2·M·N·K); other kernels' work is not known
  from their arguments alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

import numpy as np

from .weights import on_cpu

#: VM functions that are not compiled kernels: allocation, shape bookkeeping, tuple and reshape helpers
BUILTIN_PREFIX = "vm.builtin."
VM_BOOKKEEPING = "VM bookkeeping (vm.builtin.*)"


@dataclass
class KernelTime:
    name: str
    calls: int                         # calls in one model call
    ms: float                          # median over the profiled model calls of this kernel's total per call
    gflops: Optional[float] = None     # work of one model call's worth of calls, GFLOP (dense kernels only)

    @property
    def gflop_per_s(self) -> Optional[float]:
        return self.gflops / (self.ms * 1e-3) if self.gflops and self.ms > 0 else None

    def to_dict(self, total_ms: float) -> dict:
        return {"name": self.name, "calls": self.calls, "ms": self.ms,
                "share": self.ms / total_ms if total_ms > 0 else None, "gflop_per_s": self.gflop_per_s}


@dataclass
class KernelProfile:
    kernels: List[KernelTime]          # slowest first; VM bookkeeping last
    call_ms: float                     # median un-instrumented call, interleaved with the profiled ones
    profiled_ms: float                 # median instrumented call (kernels + bookkeeping + the instrument's cost)
    runs: int

    @property
    def kernels_ms(self) -> float:
        return sum(k.ms for k in self.kernels)

    def to_dict(self) -> dict:
        total = self.kernels_ms
        return {"call_ms": self.call_ms, "profiled_call_ms": self.profiled_ms, "kernels_ms": total, "runs": self.runs,
                "kernels": [k.to_dict(total) for k in self.kernels]}

    def table(self, top: int = 12, peak=None) -> str:
        """Markdown: the ``top`` slowest kernels, the rest folded into one row, VM bookkeeping last. ``peak``:
        kernel name → the host's peak GFLOP/s (GOP/s) for it, adding each dense kernel's share of it."""
        total = self.kernels_ms
        compiled = [k for k in self.kernels if k.name != VM_BOOKKEEPING]
        shown = compiled[:top]
        rest = compiled[top:]
        if rest:
            shown.append(KernelTime(f"{len(rest)} other kernels", sum(k.calls for k in rest), sum(k.ms for k in rest)))
        shown += [k for k in self.kernels if k.name == VM_BOOKKEEPING]
        lines = ["| kernel | calls | ms | share | ms per call | GFLOP/s | of peak |", "|---|---|---|---|---|---|---|"]
        for k in shown:
            rate = f"{k.gflop_per_s:.1f}" if k.gflop_per_s else ""
            limit = peak(k.name) if peak is not None and k.gflop_per_s else None
            of_peak = f"{k.gflop_per_s / limit * 100:.0f} %" if limit else ""
            lines.append(f"| {k.name} | {k.calls} | {k.ms:.3f} | {k.ms / total * 100 if total else 0:.1f} % | "
                         f"{k.ms / max(k.calls, 1):.3f} | {rate} | {of_peak} |")
        lines.append(f"kernels {total:.2f} ms per call (median of {self.runs} profiled calls: "
                     f"{self.profiled_ms:.2f} ms with the instrument); un-instrumented call {self.call_ms:.2f} ms")
        return "\n".join(lines)


def dense_gflops(name: str, args) -> Optional[float]:
    """2·M·N·K of a ``fused_dense`` kernel call (``fused_dense_int8``'s too: operations, not floating-point ones)
    from its arguments (x first, the output last), else None."""
    if not name.startswith("fused_dense") or len(args) < 2:
        return None
    x, out = args[0], args[-1]
    xs, os_ = tuple(getattr(x, "shape", ())), tuple(getattr(out, "shape", ()))
    if len(xs) < 2 or len(os_) < 2 or xs[:-1] != os_[:-1] or "float32" not in str(getattr(out, "dtype", "")):
        return None
    return 2.0 * float(np.prod(os_)) * int(xs[-1]) / 1e9


def profile_kernels(model, inputs: Mapping[str, np.ndarray], runs: int = 10, warmup: int = 2) -> KernelProfile:
    """Time every kernel of ``model``'s call on ``inputs`` (by ONNX name), ``runs`` times after ``warmup`` calls.

    ``model``: a :class:`~tvm_fusion_ext.deploy.DeployedModel` or a :class:`~tvm_fusion_ext.runtime.CompiledModel`
    (anything with ``new_vm()`` and ``device_arguments(inputs)``)."""
    if runs <= 0:
        raise ValueError(f"profile_kernels: runs must be positive, got {runs}")
    model.run(inputs)  # inputs the model itself refuses (shapes that do not fit together) fail here, in one line
    args = model.device_arguments(inputs)
    plain, profiled = model.new_vm()["main"], model.new_vm()
    device = model.device
    is_cpu = on_cpu(device)
    per_run: List[Dict[str, float]] = []
    calls: Dict[str, int] = {}
    work: Dict[str, float] = {}
    state: Dict[str, float] = {}

    def instrument(func, name, before_run, ret_value, *call_args):
        name = str(name)
        if not is_cpu:
            device.sync()
        if before_run:
            state["start"] = time.perf_counter()
            return 0
        elapsed = time.perf_counter() - state["start"]
        if not per_run:  # warm-up
            return 0
        key = VM_BOOKKEEPING if name.startswith(BUILTIN_PREFIX) else name
        current = per_run[-1]
        current[key] = current.get(key, 0.0) + elapsed
        if len(per_run) == 1:
            calls[key] = calls.get(key, 0) + 1
            flops = dense_gflops(name, call_args)
            if flops is not None:
                work[key] = work.get(key, 0.0) + flops
        return 0

    profiled.set_instrument(instrument)
    main = profiled["main"]
    for _ in range(warmup):
        plain(*args)
        main(*args)
    plain_ms, profiled_ms = [], []
    for _ in range(runs):
        t = time.perf_counter()
        plain(*args)
        device.sync()
        plain_ms.append((time.perf_counter() - t) * 1e3)
        per_run.append({})
        t = time.perf_counter()
        main(*args)
        device.sync()
        profiled_ms.append((time.perf_counter() - t) * 1e3)
    ms = {n: float(np.median([r.get(n, 0.0) for r in per_run])) * 1e3 for n in calls}
    names = sorted(calls, key=lambda n: (n == VM_BOOKKEEPING, -ms[n]))
    kernels = [KernelTime(n, calls[n], ms[n], work.get(n)) for n in names]
    return KernelProfile(kernels, float(np.median(plain_ms)), float(np.median(profiled_ms)), runs)
