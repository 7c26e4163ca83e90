"""An artifact against the static build of the same ONNX file and ONNX Runtime, timed in interleaved blocks.

    python scripts/bench_artifact_interleaved.py MODEL.onnx ARTIFACT [--shapes 1x16,1x48,1x128,1x384,8x128]
        [--rounds 8] [--threads deployed|off] [--stat call|block]

The deployment table (docs/performance.md): the artifact (``deploy.load``), the same file built for exactly each shape (``static``) and ONNX
Runtime on the same (dynamic) file, two threads each. Each runtime lives in its own process, so that one's thread
pool cannot slow another's; each round times one block of every runtime in turn, so a change in the machine's speed
(a shared VM's neighbours, turbo) lands on all three alike, where ``tvm-fusion bench`` times one runtime after the
other. Prints medians in ms and the ratios, with the largest difference from ONNX Runtime's output. Inputs: random
token ids, a full mask, zero token types (the inputs a BERT-style encoder export takes).

``--stat call`` (default): the median of every timed call of every round, each call timed on its own. ``--stat
block``: the median of the rounds' block means (this script's statistic until 2026-11-27). On a shared VM a
neighbour's burst lands inside some blocks and not others; a block's mean carries it, the median call does not.

``--threads deployed`` (default): every runtime with its own idle-thread policy, as it would serve: ONNX Runtime's
spinning workers, our runtime's brief yield (``deploy.threads.SHORT_SPIN_COUNT``) for the artifact and the static
build alike. ``--threads off``: no runtime's idle workers spin or yield (``tvm-fusion bench``'s default, for a
machine other jobs share).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

RUNTIMES = ("artifact", "static", "ort")
#: a pause after each block: ONNX Runtime's idle workers keep spinning for about 40 ms after its last call (measured
#: here as the process's CPU time while it waits), which would otherwise land on the next runtime's block
SETTLE_S = 0.1
#: untimed calls that start each block, and the block's length: after the pause every runtime's workers sleep, and
#: the calls right after a sleep are slower (waking them, caches the others used; on this VM up to ~25 ms of calls),
#: so a block is long and times what follows
WARM_CALLS = 2
BLOCK_S = 0.5


def _feeds(names, b, s):
    rng = np.random.default_rng(0)
    return {n: (rng.integers(0, 1000, (b, s)) if n == "input_ids" else
                np.ones((b, s)) if "mask" in n else np.zeros((b, s))).astype("int64") for n in names}


def worker(kind: str, model: str, artifact: str, shapes: list, threads: str, out_dir: str) -> None:
    """One runtime, driven over stdin: a line ``I`` times one block of shape ``I`` and prints its seconds per call."""
    if threads == "off":
        from tvm_fusion_ext.tools.bench.peers import set_thread_spinning

        set_thread_spinning(False)
    import onnx

    names = [i.name for i in onnx.load(model, load_external_data=False).graph.input]
    calls = []
    if kind == "ort":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        if threads == "off":
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        for b, s in shapes:
            feeds = _feeds(names, b, s)
            calls.append((lambda f=feeds: session.run(None, f)[0], feeds))
    elif kind == "artifact":
        from tvm_fusion_ext.deploy import load

        deployed = load(artifact)
        for b, s in shapes:
            feeds = _feeds(names, b, s)
            calls.append((lambda f=feeds: next(iter(deployed.run(f).values())), feeds))
    else:
        from tvm_fusion_ext.frontend import load_onnx
        from tvm_fusion_ext.runtime import CompiledModel

        for b, s in shapes:
            feeds = _feeds(names, b, s)
            static = CompiledModel.from_module(load_onnx(model, shapes={n: [b, s] for n in names}))
            calls.append((lambda f=feeds, m=static: next(iter(m.run(f).values())), feeds))
    per = []
    for i, (call, _) in enumerate(calls):
        np.save(os.path.join(out_dir, f"{kind}-{i}.npy"), call())
        once = []
        for _ in range(3):
            t = time.perf_counter()
            call()
            once.append(time.perf_counter() - t)
        per.append(max(3, round(BLOCK_S / float(np.median(once)))))
    print("ready", flush=True)
    for line in sys.stdin:
        i = int(line)
        call = calls[i][0]
        for _ in range(WARM_CALLS):
            call()
        times = []
        for _ in range(per[i]):
            t = time.perf_counter()
            call()
            times.append(time.perf_counter() - t)
        print(",".join(f"{v:.9f}" for v in times), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("artifact")
    ap.add_argument("--shapes", default="1x16,1x48,1x128,1x384,8x128")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", choices=("deployed", "off"), default="deployed")
    ap.add_argument("--stat", choices=("call", "block"), default="call",
                    help="median of single calls (default) or of the rounds' block means")
    ap.add_argument("--worker", choices=RUNTIMES, help=argparse.SUPPRESS)
    ap.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",")]
    if args.worker:
        return worker(args.worker, args.model, args.artifact, shapes, args.threads, args.out_dir)

    with tempfile.TemporaryDirectory(prefix="tfx-interleaved-") as tmp:
        procs = {kind: subprocess.Popen([sys.executable, __file__, args.model, args.artifact, "--shapes", args.shapes,
                                         "--threads", args.threads, "--worker", kind, "--out-dir", tmp],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for kind in RUNTIMES}
        try:
            for kind, proc in procs.items():  # one at a time: the static build compiles every shape first
                if proc.stdout.readline().strip() != "ready":
                    raise SystemExit(f"the {kind} worker failed (its error is above)")
            what = "median call" if args.stat == "call" else "median of block means"
            print(f"threads: {args.threads}; {args.rounds} rounds; {what}, in ms")
            print("| (batch, seq) | artifact | static | ONNX Runtime | artifact / static | artifact / ORT "
                  "| static / ORT | max diff |")
            print("|---|---|---|---|---|---|---|---|")
            for i, (b, s) in enumerate(shapes):
                want = np.load(os.path.join(tmp, f"ort-{i}.npy"))
                diff = max(float(np.abs(np.load(os.path.join(tmp, f"{k}-{i}.npy")) - want).max())
                           for k in ("artifact", "static"))
                times = {k: [] for k in RUNTIMES}
                for _ in range(args.rounds):
                    for kind, proc in procs.items():
                        proc.stdin.write(f"{i}\n")
                        proc.stdin.flush()
                        calls = [float(v) for v in proc.stdout.readline().split(",")]
                        times[kind] += calls if args.stat == "call" else [sum(calls) / len(calls)]
                        time.sleep(SETTLE_S)
                m = {k: 1e3 * float(np.median(v)) for k, v in times.items()}
                print(f"| ({b}, {s}) | {m['artifact']:.2f} | {m['static']:.2f} | {m['ort']:.2f} | "
                      f"{m['artifact'] / m['static']:.2f} | {m['artifact'] / m['ort']:.2f} | "
                      f"{m['static'] / m['ort']:.2f} | {diff:.1e} |", flush=True)
        finally:
            for proc in procs.values():
                proc.stdin.close()
                proc.wait(timeout=60)


if __name__ == "__main__":
    main()
