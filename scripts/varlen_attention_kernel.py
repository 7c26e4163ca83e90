"""The packed (varlen) fused_attention against the padded one on the same batch, CPU, kernels only: MiniLM's heads,
the lengths ``tvm-fusion bench --batch 8 --lengths 16-128`` draws with seed 0. Both built with symbolic sizes (as
RemovePadding builds them), timed interleaved; prints the medians and their ratio.

    PYTHONPATH=$PWD python scripts/varlen_attention_kernel.py                  # MiniLM, batch 8, lengths 16-128
    PYTHONPATH=$PWD python scripts/varlen_attention_kernel.py --lengths 32-512 --batch 16 --head-dim 64 \
        --rounds 5 --number 1                                                  # BERT-base size, drawn lengths
"""

import argparse

import numpy as np
import tvm
from tvm import relax, tirx

from tvm_fusion_ext.compile.pipeline import compile_model
from tvm_fusion_ext.ops import call_op
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.testing import build_module

H = 12
MINILM_LENGTHS = [112, 87, 73, 46, 50, 20, 24, 17]  # what `bench --batch 8 --lengths 16-128` draws with seed 0
PACKED = ("q", "k", "v", "cu_seqlens", "row_seq", "key_bias")


def _build(names, shapes, dtypes, scale):
    args = [relax.Var(n, relax.TensorType(s, t)) for n, s, t in zip(names, shapes, dtypes)]
    mod = build_module(args, lambda bb: call_op(bb, "fused_attention", dict(zip(names, args)), {"scale": scale}))
    return compile_model(mod, resolve_target("llvm"), fuse_graph=False).executable


def _timer(executable, arrays, dev, number):
    vm = relax.VirtualMachine(executable, dev)
    vm.set_input("main", *[tvm.runtime.tensor(a) for a in arrays])
    return vm.time_evaluator("invoke_stateful", dev, number=number, repeat=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", help="MIN-MAX: draw --batch lengths uniformly (numpy default_rng(0)); default: "
                                      "MiniLM's batch-8 lengths")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--number", type=int, default=10, help="calls per timing")
    args = ap.parse_args()
    LENGTHS = MINILM_LENGTHS
    if args.lengths:
        lo, hi = (int(x) for x in args.lengths.split("-"))
        LENGTHS = [int(x) for x in np.random.default_rng(0).integers(lo, hi + 1, args.batch)]
    D = args.head_dim
    B, S, T = len(LENGTHS), max(LENGTHS), sum(LENGTHS)
    batch, seq = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    padded = _build(("q", "k", "v", "mask"), [[batch, seq, H, D]] * 3 + [[batch, 1, 1, seq]], ["float32"] * 4,
                    D ** -0.5)
    tokens, nseq, span = (tirx.Var(n, "int64") for n in ("tokens", "nseq", "span"))
    packed = _build(PACKED, [[1, tokens, H, D]] * 3 + [[nseq + 1], [tokens], [nseq, span]],
                    ["float32"] * 3 + ["int64", "int64", "float32"], D ** -0.5)
    rng = np.random.default_rng(0)
    mask = np.where(np.arange(S)[None] < np.array(LENGTHS)[:, None], 0.0, -1e4).astype("float32")
    padded_in = [rng.standard_normal((B, S, H, D)).astype("float32") for _ in range(3)] + [mask.reshape(B, 1, 1, S)]
    packed_in = [rng.standard_normal((1, T, H, D)).astype("float32") for _ in range(3)] + [
        np.concatenate([[0], np.cumsum(LENGTHS)]).astype("int64"), np.repeat(np.arange(B), LENGTHS).astype("int64"),
        np.zeros((B, S), "float32")]
    dev = tvm.cpu()
    timers = {"padded [B, S]": _timer(padded, padded_in, dev, args.number),
              "packed [T]": _timer(packed, packed_in, dev, args.number)}
    ms = {name: [] for name in timers}
    for _ in range(args.rounds):
        for name, timer in timers.items():
            ms[name].append(timer("main").mean * 1e3)
    print(f"lengths {LENGTHS}: B={B} S={S} T={T} ({T / (B * S):.0%} valid), H={H} d={D}")
    print(f"{'kernel':<16}{'median ms':>10}{'p10':>9}{'p90':>9}")
    for name, xs in ms.items():
        print(f"{name:<16}{np.median(xs):>10.3f}{np.percentile(xs, 10):>9.3f}{np.percentile(xs, 90):>9.3f}")
    print(f"packed / padded: {np.median(ms['packed [T]']) / np.median(ms['padded [B, S]']):.2f}")


if __name__ == "__main__":
    main()
