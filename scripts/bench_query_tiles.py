"""The symbolic CPU attention kernel with and without its long-request query tiles (compile/variants/query_tiles.py).

    python scripts/bench_query_tiles.py [--shapes 1x80,1x96,1x100,1x128,1x384,8x128] [--heads 12] [--head-dim 32]
        [--rounds 9]

MiniLM's form: batch and sequence symbolic, Q, K and V read in place from one ``[B, S, 3·H, D]`` projection
output, a ``[B, 1, 1, S]`` additive mask. Two builds in one process: the kernel as the package builds it, and the
same kernel with the query-tile dispatch's cost table reduced to the 16-row tile (no branches: the kernel before
the pass). Timed in interleaved blocks (medians in µs, two threads), checked against float64 numpy. Prints which
tile each shape takes and the time with the dispatch over the time without.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _build(heads: int, head_dim: int, with_tiles: bool):
    import tvm
    from tvm import relax, tirx

    from tvm_fusion_ext.compile import build
    from tvm_fusion_ext.compile.variants import query_tiles
    from tvm_fusion_ext.ops import call_op
    from tvm_fusion_ext.schedules.cpu.attention import SYMBOLIC_QUERY_TILE
    from tvm_fusion_ext.targets import resolve_target

    b, s = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    qkv = relax.Var("qkv", relax.TensorType([b, s, 3 * heads, head_dim], "float32"))
    mask = relax.Var("mask", relax.TensorType([b, 1, 1, s], "float32"))
    params = {"scale": float(head_dim) ** -0.5, "heads": heads, "kv_heads": heads, "q_head_start": 0,
              "k_head_start": heads, "v_head_start": 2 * heads}
    bb = relax.BlockBuilder()
    with bb.function("main", [qkv, mask]):
        with bb.dataflow():
            out = bb.emit_output(call_op(bb, "fused_attention", {"q": qkv, "k": qkv, "v": qkv, "mask": mask}, params))
        bb.emit_func_output(out)
    costs = dict(query_tiles.ROW_COST)
    if not with_tiles:
        query_tiles.ROW_COST = {SYMBOLIC_QUERY_TILE: costs[SYMBOLIC_QUERY_TILE]}
    try:
        executable = build(bb.get(), resolve_target("llvm"), fuse=False)
    finally:
        query_tiles.ROW_COST = costs
    return relax.VirtualMachine(executable, tvm.cpu())


def _reference(x, heads, scale):
    from tvm_fusion_ext.testing import attention_reference

    q, k, v = (x[:, :, i * heads:(i + 1) * heads] for i in range(3))
    return attention_reference(q, k, v, 0.0, scale)


def _chosen_tile(heads: int, head_dim: int, batch: int, seq: int) -> int:
    """The tile the dispatch picks for this request (the same test the kernel makes)."""
    from tvm import relax, tirx

    from tvm_fusion_ext.compile.variants import query_tiles
    from tvm_fusion_ext.ops.registry import make_prim_func
    from tvm_fusion_ext.schedules.cpu.attention import SYMBOLIC_QUERY_TILE
    from tvm_fusion_ext.targets import TargetInfo, resolve_target

    ty = relax.TensorType([tirx.Var("batch", "int64"), tirx.Var("seq", "int64"), 3 * heads, head_dim], "float32")
    func = make_prim_func("fused_attention", {"q": ty, "k": ty, "v": ty}, {
        "scale": 1.0, "heads": heads, "kv_heads": heads, "k_head_start": heads, "v_head_start": 2 * heads,
        "query_block": SYMBOLIC_QUERY_TILE})
    return query_tiles.tile_for(func, TargetInfo.of(resolve_target("llvm")).cores, batch, seq)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x80,1x96,1x100,1x128,1x384,8x128")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    from tvm_fusion_ext.deploy.threads import configure_cpu_threads

    configure_cpu_threads()
    import tvm

    heads, d = args.heads, args.head_dim
    builds = {"with": _build(heads, d, True), "without": _build(heads, d, False)}
    rng = np.random.default_rng(0)
    print(f"fused_attention, {heads} heads × {d}, Q/K/V in place, symbolic (batch, seq); median µs per call")
    print("| (batch, seq) | tile | with the dispatch | without | with / without | max diff |")
    print("|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        batch, seq = (int(v) for v in shape.split("x"))
        x = rng.standard_normal((batch, seq, 3 * heads, d)).astype("float32")
        inputs = [tvm.runtime.tensor(x), tvm.runtime.tensor(np.zeros((batch, 1, 1, seq), "float32"))]
        want = _reference(x, heads, float(d) ** -0.5)
        diff = max(float(np.abs(vm["main"](*inputs).numpy() - want).max()) for vm in builds.values())
        times = {name: [] for name in builds}
        calls = max(2, 100 // batch)
        for _ in range(args.rounds):
            for name, vm in builds.items():
                vm["main"](*inputs)
                start = time.perf_counter()
                for _ in range(calls):
                    vm["main"](*inputs)
                times[name].append((time.perf_counter() - start) / calls)
        med = {name: float(np.median(t)) * 1e6 for name, t in times.items()}
        print(f"| ({batch}, {seq}) | {_chosen_tile(heads, d, batch, seq)} | {med['with']:.1f} | {med['without']:.1f} "
              f"| {med['with'] / med['without']:.3f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
