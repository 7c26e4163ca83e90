"""The peers we measure against, each behind one function: ONNX Runtime, PyTorch eager, stock TVM.

Also the thread settings that make their timings comparable on a shared machine (:func:`set_thread_spinning`)
and the environment a result was measured in.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Callable, Dict, Optional

import numpy as np

from ...deploy.native_log import captured_stderr
from ...errors import TargetError
from ..timing import time_block

def check_target(spec: str):
    import tvm

    from ...targets import TargetInfo, resolve_target

    target = resolve_target(spec)
    if TargetInfo.of(target).is_cuda and not tvm.cuda(0).exist:
        raise TargetError("no GPU is available: cuda runs need a GPU (use --target llvm)")
    return target


def threads_for(target) -> int:
    """Threads every runtime gets: the target's cores (the host's, for a CUDA target)."""
    from ...targets import TargetInfo

    return TargetInfo.of(target).cores


def set_thread_spinning(spin: bool) -> dict:
    """By default ORT, torch (OpenMP) and TVM's thread pool keep idle workers busy-waiting between parallel
    regions. On a machine shared with other processes a descheduled spinning worker stalls every barrier
    (measured on this project's 2-core VM at load ~7: torch MiniLM-1-layer 187 ms spinning vs 3 ms passive,
    ORT MiniLM 122-159 ms vs 69-74 ms). ``spin=False`` turns it off for all three alike; it must run before
    torch and TVM's pool start their threads (environment variables set by the user win)."""
    import sys

    if not spin:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
    return {"thread_spinning": spin, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
            "TVM_THREAD_POOL_SPIN_COUNT": os.environ.get("TVM_THREAD_POOL_SPIN_COUNT"),
            "torch_imported_before": "torch" in sys.modules}


def torch_runner(info: dict, feeds: Dict[str, np.ndarray], threads: int) -> Callable[[], np.ndarray]:
    import torch

    from ...models import hf_input_names, hf_model

    module, _ = hf_model(info["kind"], attn=info.get("attn", "sdpa"), num_layers=info.get("num_layers"),
                         seed=int(info.get("seed", 0)))
    torch.set_num_threads(threads)
    names = hf_input_names(info["kind"])
    shape = next(iter(feeds.values())).shape
    args = tuple(torch.from_numpy(np.ascontiguousarray(feeds[n])) if n in feeds
                 else torch.zeros(shape, dtype=torch.int64) for n in names)

    def call():
        with torch.inference_mode():
            return module(*args)

    return call


#: what TVM's C++ logger prints (to the process's stderr) each time its default legalization lowers a Gather with
#: ``mode="fast"``; stock TVM's build of any BERT-like model prints it once per embedding table
_FAST_GATHER_WARNING = "Fast mode segfaults when there are out-of-bounds indices"
#: the one line the bench prints instead
FAST_GATHER_NOTE = ("(stock TVM's Gather lowering warned that it does not check indices; the inputs here are in "
                    "range, and our own build checks token ids at run time)")


def stock_tvm(mod, like, out=None):
    """Plain ``tvm.compile`` with TVM's own default pipeline: the baseline a TVM user starts from.

    TVM's logger writes a warning about unchecked Gather indices straight to file descriptor 2 while it builds;
    the build runs with that descriptor captured, the warning is replaced by one explanatory line (``out``), and
    anything else TVM wrote is passed through."""
    import tvm
    from tvm import relax

    from ...runtime import CompiledModel

    with captured_stderr() as captured:
        ex = tvm.compile(mod, like.target, relax_pipeline=relax.get_default_pipeline(like.target))
    other = [line for line in captured if _FAST_GATHER_WARNING not in line]
    if other:
        sys.stderr.write("\n".join(other) + "\n")
    if len(other) < len(captured) and out is not None:
        out(FAST_GATHER_NOTE)
    return CompiledModel(ex, like.target, like.input_specs, like.output_names, "stock")


def ort_session(path: str, threads: Optional[int], spin: bool = True, profile_prefix: Optional[str] = None):
    """ORT's CPU session as the benchmark runs it; ``profile_prefix``: with its profiler on, the file there."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if profile_prefix is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        opts.intra_op_num_threads = threads
    if not spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def torch_attention(q, k, v, ref, threads, repeat, max_seconds) -> dict:
    import torch

    torch.set_num_threads(threads)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))

    def call():
        with torch.inference_mode():
            return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)

    diff = float(np.abs(call().numpy() - ref).max())
    timing = time_block("torch sdpa", call, warmup=1, repeat=repeat, max_seconds=max_seconds)
    # torch's CPU SDPA picks its own kernel (a flash-style one for fp32 when it can); its scratch memory is
    # not observable from here, so we do not guess it
    return {**timing.to_dict(), "workspace_bytes": None, "max_abs_diff": diff,
            "note": "workspace not measured (torch CPU SDPA's internal buffers are not observable)"}


def environment() -> dict:
    import importlib.metadata as md

    import time

    env = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
           "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d", time.gmtime())}
    for pkg in ("apache-tvm", "onnxruntime", "torch", "transformers"):
        try:
            env[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return env



def cpu_name() -> str:
    """The CPU's model name as ``/proc/cpuinfo`` gives it (the host class a figure belongs to), else the platform's."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine()
