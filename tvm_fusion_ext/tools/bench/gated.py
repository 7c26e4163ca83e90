"""Gated-MLP kernel mode of ``tvm-fusion bench`` (``--gated MxKxN``): ``silu(x·Wg) ⊙ (x·Wu)`` three ways in one
run, each checked against numpy:

* ``fused_gated_dense``: SemanticFusion as shipped (one kernel, interleaved weight panels);
* ``without FuseGatedMLP``: the same pipeline minus that rule (the QKV rule then merges the two projections
  into one dense over [Wg | Wu], and the split, SiLU and product run as separate kernels): what the rule saves;
* torch eager (``F.silu(x @ Wg) * (x @ Wu)``), with the same thread count, when torch is installed.
"""

from __future__ import annotations

from typing import Callable, List

import numpy as np

from .kernels import parse_mkn
from ..reference import numpy_activation
from ..timing import time_block
from .peers import environment, set_thread_spinning, threads_for


def _graph(m: int, k: int, wg: np.ndarray, wu: np.ndarray):
    """``main(x [m, k])``: the gated unit as an exporter writes it (SiLU as ``g · sigmoid(g)``)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            g = bb.emit(relax.op.matmul(x, relax.const(wg)))
            gate = bb.emit(relax.op.multiply(g, bb.emit(relax.op.sigmoid(g))))
            up = bb.emit(relax.op.matmul(x, relax.const(wu)))
            y = bb.emit_output(relax.op.multiply(gate, up))
        bb.emit_func_output(y)
    return bb.get()


def _without_gated_rule():
    import tvm

    from ...transform.pipeline import SemanticFusion

    return tvm.transform.Sequential([p for p in SemanticFusion().passes if "GatedMLP" not in p.info.name])


def bench_gated(shape: str, repeat: int = 30, spin: bool = False, out: Callable[[str], None] = print) -> dict:
    """Median latency of the three at ``shape`` = "MxKxN" (N: the intermediate width), with ratios."""
    spinning = set_thread_spinning(spin)
    import importlib.util

    import tvm
    from tvm import relax

    from ...compile import build
    from ...targets import resolve_target

    m, k, n = parse_mkn(shape, "--gated", "512x1024x2816")
    target = resolve_target("llvm")
    threads = threads_for(target)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype("float32")
    wg, wu = ((rng.standard_normal((k, n)) / np.sqrt(k)).astype("float32") for _ in range(2))
    ref = numpy_activation(x.astype(np.float64) @ wg, "silu") * (x.astype(np.float64) @ wu)
    mod = _graph(m, k, wg, wu)
    xt = tvm.runtime.tensor(x)

    rows: List[dict] = []

    def measure(name, call):
        diff = float(np.abs(np.asarray(call()) - ref).max())
        timing = time_block(name, call, warmup=5, repeat=repeat)
        rows.append({"runtime": name, **timing.to_dict(), "max_abs_diff": diff})

    fused = relax.VirtualMachine(build(mod, target), tvm.cpu())
    measure("fused_gated_dense", lambda: fused["main"](xt).numpy())
    unfused = relax.VirtualMachine(build(_without_gated_rule()(mod), target, fuse=False), tvm.cpu())
    measure("without FuseGatedMLP", lambda: unfused["main"](xt).numpy())
    if importlib.util.find_spec("torch") is not None:  # optional peer
        import torch

        torch.set_num_threads(threads)
        tx, tg, tu = (torch.from_numpy(a) for a in (x, wg, wu))

        def torch_call():
            with torch.inference_mode():
                return (torch.nn.functional.silu(tx @ tg) * (tx @ tu)).numpy()

        measure("torch eager", torch_call)

    base = rows[0]["median_ms"]
    out(f"gated MLP silu(x·Wg) ⊙ (x·Wu), M×K×N = {m}×{k}×{n}, fp32, {threads} threads")
    out(f"{'runtime':<22} {'median ms':>10} {'p10':>8} {'p90':>8} {'vs fused':>9} {'max |diff|':>11}")
    for r in rows:
        out(f"{r['runtime']:<22} {r['median_ms']:>10.3f} {r['p10_ms']:>8.3f} {r['p90_ms']:>8.3f} "
            f"{r['median_ms'] / base:>8.2f}x {r['max_abs_diff']:>11.1e}")
    return {"mode": "gated", "shape": [m, k, n], "threads": threads, "results": rows, "threading": spinning,
            "environment": environment()}
