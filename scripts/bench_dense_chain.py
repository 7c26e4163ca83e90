"""Twelve chained dense layers (MiniLM's FFN shapes, 384 → 1536 → 384, ×6), ours against ONNX Runtime's MatMuls.

    python scripts/bench_dense_chain.py [--rows 8,16,48] [--rounds 15] [--layers 12]

Static rows, no bias or activation, two threads each, timed interleaved in one process (blocks of 10 calls, 15
rounds, medians in ms). Two weight sets: ``cold``, twelve distinct matrices (28 MB, streamed from L3 on every
call, as in a model), and ``hot``, one pair shared by all twelve layers (in L2 after the first call). The
difference between the two columns is what streaming the weights costs each runtime at that many rows.
``--layers 24``: 57 MB of distinct weights, more than this host's 32 MB L3: ``cold`` then streams from DRAM.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

K = 384
LAYERS = 12  # --layers


def _weights(rng, shared: bool, layers: int = LAYERS):
    pair = [(rng.standard_normal((K, 4 * K)) / np.sqrt(K)).astype("float32"),
            (rng.standard_normal((4 * K, K)) / np.sqrt(4 * K)).astype("float32")]
    if shared:
        return [pair[i % 2] for i in range(layers)]
    return [(rng.standard_normal(pair[i % 2].shape) / np.sqrt(pair[i % 2].shape[0])).astype("float32")
            for i in range(layers)]


def _ours(weights, rows):
    import tvm
    from tvm import relax

    from tvm_fusion_ext.compile.pipeline import compile_model
    from tvm_fusion_ext.ops import call_op
    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.testing import build_module

    x = relax.Var("x", relax.TensorType([1, rows, K], "float32"))

    def body(bb):
        y = x
        for w in weights:
            y = bb.emit(call_op(bb, "fused_dense", {"x": y, "w": relax.const(w)}, {"act": "none"}))
        return y

    compiled = compile_model(build_module([x], body), resolve_target("llvm"), fuse_graph=False)
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    return lambda xt: vm["main"](xt)


def _ort(weights):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, prev = [], [], "x"
    for i, w in enumerate(weights):
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"y{i}"]))
        prev = f"y{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", K])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as our pool between blocks
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"x": x})[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="8,16,48")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--layers", type=int, default=LAYERS, help="chained layers (even: FFN pairs)")
    args = ap.parse_args()
    from tvm_fusion_ext.deploy.threads import configure_cpu_threads

    configure_cpu_threads()
    import tvm

    rng = np.random.default_rng(0)
    sets = {"cold": _weights(rng, shared=False, layers=args.layers),
            "hot": _weights(rng, shared=True, layers=args.layers)}
    print("| rows | ours, cold | ORT, cold | ours, hot | ORT, hot | ours / ORT, cold | ours / ORT, hot |")
    print("|---|---|---|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        x = rng.standard_normal((1, rows, K)).astype("float32")
        xt = tvm.runtime.tensor(x)
        calls = {}
        for name, weights in sets.items():
            ours, theirs = _ours(weights, rows), _ort(weights)
            diff = float(np.abs(ours(xt).numpy() - theirs(x)).max())
            if diff > 1e-3:
                raise SystemExit(f"{rows} rows, {name}: ours and ONNX Runtime differ by {diff:.1e}")
            calls[f"ours {name}"] = lambda f=ours: f(xt)
            calls[f"ort {name}"] = lambda f=theirs: f(x)
        times = {k: [] for k in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                for _ in range(3):
                    call()
                t = time.perf_counter()
                for _ in range(10):
                    call()
                times[name].append((time.perf_counter() - t) / 10 * 1e3)
        m = {k: float(np.median(v)) for k, v in times.items()}
        print(f"| {rows} | {m['ours cold']:.3f} | {m['ort cold']:.3f} | {m['ours hot']:.3f} | {m['ort hot']:.3f} | "
              f"{m['ours cold'] / m['ort cold']:.2f} | {m['ours hot'] / m['ort hot']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
