"""An artifact against the static build of the same ONNX file and ONNX Runtime, timed in interleaved blocks.

    python scripts/bench_artifact_interleaved.py MODEL.onnx ARTIFACT [--shapes 1x16,1x48,1x128,1x384,8x128]
        [--rounds 25]

Issue #10's table: the artifact (``deploy.load``), the same file built in this process for exactly each shape
(``static``) and ONNX Runtime on the same (dynamic) file, every runtime with two threads and no spinning. Each round
times one block of every runtime in turn, so a change in the machine's speed (a shared VM's neighbours, turbo)
lands on all three alike; ``tvm-fusion bench`` times one runtime after the other. Prints medians in ms and the
ratios, with the largest difference from ONNX Runtime's output. Inputs: random token ids, a full mask, zero
token types (the inputs a BERT-style encoder export takes).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("artifact")
    ap.add_argument("--shapes", default="1x16,1x48,1x128,1x384,8x128")
    ap.add_argument("--rounds", type=int, default=25)
    args = ap.parse_args()

    import onnxruntime as ort

    from tvm_fusion_ext.deploy import load
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.runtime import CompiledModel
    from tvm_fusion_ext.tools.bench.peers import set_thread_spinning

    set_thread_spinning(False)
    deployed = load(args.artifact)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    print("| (batch, seq) | artifact | static | ONNX Runtime | artifact / static | artifact / ORT | static / ORT "
          "| max diff |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        b, s = (int(v) for v in shape.split("x"))
        rng = np.random.default_rng(0)
        feeds = {n: (rng.integers(0, 1000, (b, s)) if n == "input_ids" else
                     np.ones((b, s)) if "mask" in n else np.zeros((b, s))).astype("int64") for n in names}
        static = CompiledModel.from_module(load_onnx(args.model, shapes={n: [b, s] for n in names}))
        runs = {"artifact": lambda: next(iter(deployed.run(feeds).values())),
                "static": lambda: next(iter(static.run(feeds).values())),
                "ort": lambda: session.run(None, feeds)[0]}
        want = runs["ort"]()
        diff = max(float(np.abs(runs[k]() - want).max()) for k in ("artifact", "static"))
        per = max(1, 384 // (b * s))  # blocks of at least a few ms
        times = {k: [] for k in runs}
        for _ in range(args.rounds):
            for k, f in runs.items():
                t = time.perf_counter()
                for _ in range(per):
                    f()
                times[k].append((time.perf_counter() - t) / per)
        m = {k: 1e3 * float(np.median(v)) for k, v in times.items()}
        print(f"| ({b}, {s}) | {m['artifact']:.2f} | {m['static']:.2f} | {m['ort']:.2f} | "
              f"{m['artifact'] / m['static']:.2f} | {m['artifact'] / m['ort']:.2f} | {m['static'] / m['ort']:.2f} "
              f"| {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
