"""One fused dense kernel built for run-time rows against the same kernel built for exactly ROWS, in one process.

    python scripts/bench_dense_symbolic.py KxN ROWS [--act none|gelu] [--rounds 30]

Both are VM modules of a single ``fused_dense`` (x: [1, ROWS, K] or [batch, seq, K], random weight and bias), timed
interleaved: each round times 20 calls of one, then of the other. Prints the median and the ratio of medians and of
minima (symbolic / static): how much a kernel pays for not knowing its rows (docs/benchmarks.md, "Full row tiles read x
unclamped"). The symbolic module's time includes the VM's shape bookkeeping, a few microseconds per call.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _module(shape, w, b, act):
    from tvm import relax

    from tvm_fusion_ext.ops import call_op
    from tvm_fusion_ext.testing import build_module

    x = relax.Var("x", relax.TensorType(shape, "float32"))
    return build_module([x], lambda bb: bb.emit(call_op(bb, "fused_dense", {
        "x": x, "w": relax.const(w), "bias": relax.const(b)}, {"act": act})))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", help="KxN")
    ap.add_argument("rows", type=int)
    ap.add_argument("--act", default="none")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    from tvm_fusion_ext.deploy.threads import configure_cpu_threads

    configure_cpu_threads()
    import tvm
    from tvm import relax, tirx

    from tvm_fusion_ext.compile.pipeline import compile_model
    from tvm_fusion_ext.targets import resolve_target

    K, N = (int(v) for v in args.shape.split("x"))
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype("float32")
    b = rng.standard_normal(N).astype("float32")
    shapes = {"symbolic": [tirx.Var("batch", "int64"), tirx.Var("seq", "int64"), K], "static": [1, args.rows, K]}
    calls = {}
    for name, shape in shapes.items():
        vm = relax.VirtualMachine(compile_model(_module(shape, w, b, args.act), resolve_target("llvm"),
                                                fuse_graph=False).executable, tvm.cpu())
        calls[name] = vm["main"]
    x = tvm.runtime.tensor(rng.standard_normal((1, args.rows, K)).astype("float32"))
    diff = float(np.abs(calls["symbolic"](x).numpy() - calls["static"](x).numpy()).max())
    times = {k: [] for k in calls}
    for _ in range(args.rounds):
        for name, call in calls.items():
            for _ in range(3):
                call(x)
            t = time.perf_counter()
            for _ in range(20):
                call(x)
            times[name].append((time.perf_counter() - t) / 20 * 1e6)
    sym, st = times["symbolic"], times["static"]
    print(f"{args.rows} x {K} x {N} ({args.act}): symbolic {np.median(sym):.1f} us, static {np.median(st):.1f} us, "
          f"symbolic / static {np.median(sym) / np.median(st):.2f} (minima {min(sym) / min(st):.2f}), "
          f"max diff {diff:.1e}")


if __name__ == "__main__":
    main()
