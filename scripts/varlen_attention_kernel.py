"""The packed (varlen) fused_attention against the padded one on the same batch, CPU, kernels only: MiniLM's heads,
the lengths ``tvm-fusion bench --batch 8 --lengths 16-128`` draws with seed 0. Both built with symbolic sizes (as
RemovePadding builds them), timed interleaved (15 rounds of 10 calls); prints the medians and their ratio.

    PYTHONPATH=$PWD python scripts/varlen_attention_kernel.py
"""

import numpy as np
import tvm
from tvm import relax, tirx

from tvm_fusion_ext.compile.pipeline import compile_model
from tvm_fusion_ext.ops import call_op
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.testing import build_module

H, D, SCALE = 12, 32, 32 ** -0.5
LENGTHS = [112, 87, 73, 46, 50, 20, 24, 17]
PACKED = ("q", "k", "v", "cu_seqlens", "row_seq", "key_bias")


def _build(names, shapes, dtypes):
    args = [relax.Var(n, relax.TensorType(s, t)) for n, s, t in zip(names, shapes, dtypes)]
    mod = build_module(args, lambda bb: call_op(bb, "fused_attention", dict(zip(names, args)), {"scale": SCALE}))
    return compile_model(mod, resolve_target("llvm"), fuse_graph=False).executable


def _timer(executable, arrays, dev):
    vm = relax.VirtualMachine(executable, dev)
    vm.set_input("main", *[tvm.runtime.tensor(a) for a in arrays])
    return vm.time_evaluator("invoke_stateful", dev, number=10, repeat=1)


def main():
    B, S, T = len(LENGTHS), max(LENGTHS), sum(LENGTHS)
    batch, seq = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    padded = _build(("q", "k", "v", "mask"), [[batch, seq, H, D]] * 3 + [[batch, 1, 1, seq]], ["float32"] * 4)
    tokens, nseq, span = (tirx.Var(n, "int64") for n in ("tokens", "nseq", "span"))
    packed = _build(PACKED, [[1, tokens, H, D]] * 3 + [[nseq + 1], [tokens], [nseq, span]],
                    ["float32"] * 3 + ["int64", "int64", "float32"])
    rng = np.random.default_rng(0)
    mask = np.where(np.arange(S)[None] < np.array(LENGTHS)[:, None], 0.0, -1e4).astype("float32")
    padded_in = [rng.standard_normal((B, S, H, D)).astype("float32") for _ in range(3)] + [mask.reshape(B, 1, 1, S)]
    packed_in = [rng.standard_normal((1, T, H, D)).astype("float32") for _ in range(3)] + [
        np.concatenate([[0], np.cumsum(LENGTHS)]).astype("int64"), np.repeat(np.arange(B), LENGTHS).astype("int64"),
        np.zeros((B, S), "float32")]
    dev = tvm.cpu()
    timers = {"padded [B, S]": _timer(padded, padded_in, dev), "packed [T]": _timer(packed, packed_in, dev)}
    ms = {name: [] for name in timers}
    for _ in range(15):
        for name, timer in timers.items():
            ms[name].append(timer("main").mean * 1e3)
    print(f"lengths {LENGTHS}: B={B} S={S} T={T} ({T / (B * S):.0%} valid), H={H} d={D}")
    print(f"{'kernel':<16}{'median ms':>10}{'p10':>9}{'p90':>9}")
    for name, xs in ms.items():
        print(f"{name:<16}{np.median(xs):>10.3f}{np.percentile(xs, 10):>9.3f}{np.percentile(xs, 90):>9.3f}")
    print(f"packed / padded: {np.median(ms['packed [T]']) / np.median(ms['padded [B, S]']):.2f}")


if __name__ == "__main__":
    main()
