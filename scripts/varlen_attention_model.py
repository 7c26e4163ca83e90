"""One padding-free build of a model with packed (varlen) attention against the same build with every attention
forced back to stage 1 (scatter Q/K/V to [B, S], padded attention, gather): same process, same batch, interleaved
calls; prints the medians, their ratio and the largest difference at valid positions.

Stage 1 is forced by making RemovePadding see no mask as key-only (``padding.key_only_reason``), which is exactly
the path a non-key-only mask takes.

    PYTHONPATH=$PWD python scripts/varlen_attention_model.py MODEL.onnx   # a dynamic MiniLM export
"""

import sys
import time

import numpy as np
import tvm
from tvm import relax

import tvm_fusion_ext.transform.padding as padding
from tvm_fusion_ext.compile import compile_model
from tvm_fusion_ext.frontend import input_names, load_onnx

LENGTHS = [112, 87, 73, 46, 50, 20, 24, 17]  # what `bench --batch 8 --lengths 16-128` draws with seed 0


def _runner(compiled, args):
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    return lambda: vm["main"](*args)


def main(path):
    mod = load_onnx(path)
    packed = compile_model(mod, "llvm", remove_padding=True)
    key_only = padding.key_only_reason
    padding.key_only_reason = lambda *_: "forced stage 1"
    try:
        scatter = compile_model(mod, "llvm", remove_padding=True)
    finally:
        padding.key_only_reason = key_only
    B, S = len(LENGTHS), max(LENGTHS)
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 30000, (B, S)).astype("int64"),
             "attention_mask": (np.arange(S)[None] < np.array(LENGTHS)[:, None]).astype("int64"),
             "token_type_ids": np.zeros((B, S), "int64")}
    args = [tvm.runtime.tensor(feeds[n]) for n in input_names(mod)]
    runs = {"packed attention": _runner(packed, args), "scatter/gather (stage 1)": _runner(scatter, args)}
    valid = feeds["attention_mask"].astype(bool)
    outs = [run().numpy()[valid] for run in runs.values()]
    ms = {name: [] for name in runs}
    for _ in range(20):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            ms[name].append((time.perf_counter() - t0) * 1e3)
    print(f"varlen_attention: {packed.report.varlen_attention} vs {scatter.report.varlen_attention}; "
          f"max |diff| at valid positions {np.abs(outs[0] - outs[1]).max():.2e}")
    print(f"{'build':<28}{'median ms':>10}{'p10':>9}{'p90':>9}")
    for name, xs in ms.items():
        print(f"{name:<28}{np.median(xs):>10.1f}{np.percentile(xs, 10):>9.1f}{np.percentile(xs, 90):>9.1f}")
    a, b = (np.median(xs) for xs in ms.values())
    print(f"packed / stage 1: {a / b:.2f}")


if __name__ == "__main__":
    main(sys.argv[1])
