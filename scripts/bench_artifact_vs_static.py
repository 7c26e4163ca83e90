"""An artifact against the static build of the same ONNX file, both in this one process, calls interleaved.

    python scripts/bench_artifact_vs_static.py MODEL.onnx ARTIFACT [--shapes 1x16,1x48,1x128,1x384,8x128]
        [--rounds 15]

The check of artifact / static that :mod:`bench_artifact_interleaved` (one process per runtime) cannot give on a
VM where, in some runs, one of its processes is 1.3-1.8x slower at every round for reasons outside the kernels
(docs/benchmarks.md, "Symbolic kernels read their rows in place"). Here both share one process and one thread pool: each
round times a few calls of one, then of the other. Prints the median single call of each, in ms, the ratio and
their largest output difference. Inputs as that script's: random token ids, a full mask, zero token types.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_artifact_interleaved import _feeds  # noqa: E402


def interleaved_medians(calls, rounds: int, per_round: int) -> dict:
    """The median single call, in ms, of each zero-argument call in ``calls``: each round times ``per_round`` calls
    of one, then of the next, so a change in the machine's speed lands on all alike."""
    times = {k: [] for k in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            call()  # the first call after the others' pays for the caches they used
            for _ in range(per_round):
                t = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - t)
    return {k: float(np.median(v)) * 1e3 for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("artifact")
    ap.add_argument("--shapes", default="1x16,1x48,1x128,1x384,8x128")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    import onnx

    from tvm_fusion_ext.deploy import load
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.runtime import CompiledModel

    names = [i.name for i in onnx.load(args.model, load_external_data=False).graph.input]
    deployed = load(args.artifact)
    print("| (batch, seq) | artifact | static | artifact / static | max diff |")
    print("|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        b, s = (int(v) for v in shape.split("x"))
        feeds = _feeds(names, b, s)
        static = CompiledModel.from_module(load_onnx(args.model, shapes={n: [b, s] for n in names}))
        calls = {"artifact": deployed.bind(feeds), "static": static.bind(feeds)}
        diff = float(np.abs(next(iter(deployed.run(feeds).values())) - next(iter(static.run(feeds).values()))).max())
        medians = interleaved_medians(calls, args.rounds, 8 if b * s < 200 else 3)
        a, st = medians["artifact"], medians["static"]
        print(f"| ({b}, {s}) | {a:.2f} | {st:.2f} | {a / st:.2f} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
