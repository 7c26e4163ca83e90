"""Kernel modes of ``tvm-fusion bench``: the attention kernel alone (ours vs torch SDPA vs the unfused graph,
latency and workspace) and ``fused_dense`` alone (GFLOP/s)."""

from __future__ import annotations

import importlib.util
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from ...errors import InputError
from ..reference import numpy_activation
from ..timing import time_block
from .peers import environment, set_thread_spinning, threads_for, torch_attention
from .report import OURS, format_attention


def _attention_modules(heads: int, seq: int, head_dim: int):
    """(fused, unfused) Relax modules ``main(q, k, v)`` on (1, H, S, D) fp32."""
    from tvm import relax

    from ...ops import call_op

    shape = [1, heads, seq, head_dim]
    scale = float(1.0 / np.sqrt(head_dim))

    def make(body):
        bb = relax.BlockBuilder()
        q, k, v = (relax.Var(n, relax.TensorType(shape, "float32")) for n in "qkv")
        with bb.function("main", [q, k, v]):
            with bb.dataflow():
                res = bb.emit_output(body(bb, q, k, v))
            bb.emit_func_output(res)
        return bb.get()

    def fused(bb, q, k, v):
        return bb.emit(call_op(bb, "fused_attention", {"q": q, "k": k, "v": v},
                               {"scale": scale, "causal": False, "q_layout": "BHSD", "k_layout": "BHSD",
                                "v_layout": "BHSD", "out_layout": "BHSD"}))

    def unfused(bb, q, k, v):
        s = bb.emit(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2])))
        s = bb.emit(relax.op.multiply(s, relax.const(scale, "float32")))
        p = bb.emit(relax.op.nn.softmax(s, axis=-1))
        return bb.emit(relax.op.matmul(p, v))

    return make(fused), make(unfused)


def tir_allocation_bytes(func) -> List[int]:
    """Bytes of every buffer a PrimFunc allocates once lowered to flat buffers (parameters are not counted)."""
    import tvm
    from tvm import s_tir, tirx

    from ...tir_nodes import collect

    passes = [s_tir.transform.LowerInitBlock(), s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
              s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.CompactBufferAllocation(),
              s_tir.transform.LowerOpaqueBlock(), tirx.transform.FlattenBuffer()]
    lowered = tvm.ir.transform.Sequential(passes)(tvm.IRModule({"main": func}))["main"]
    sizes: List[int] = []
    for node in collect(lowered.body, tirx.AllocBuffer):
        buf = node.buffer
        dtype = tvm.DataType(str(buf.dtype))
        elems = int(np.prod([int(x) for x in buf.shape])) if len(buf.shape) else 1
        sizes.append(elems * dtype.bits * dtype.lanes // 8)
    return sizes


def workspace_bytes(mod, target) -> Dict[str, int]:
    """Bytes allocated besides the inputs and the output, in the module ``build`` compiles: Relax-level
    intermediates between kernels (``tensor``) plus what each scheduled, lowered PrimFunc allocates (``tir``).
    A sum, so an upper bound on the peak (the VM's memory planner may reuse storage)."""
    import tvm
    from tvm import relax

    from ...compile import lower, schedule

    scheduled = schedule(lower(mod, target), target)
    tir = sum(sum(tir_allocation_bytes(f)) for _, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc))
    main = scheduled["main"]
    tensor = 0
    for block in main.body.blocks:
        for binding in block.bindings:
            ty = binding.var.ty
            if isinstance(binding.var, relax.DataflowVar) and isinstance(ty, relax.TensorType) and ty.shape is not None:
                dtype = tvm.DataType(str(ty.dtype))
                tensor += int(np.prod([int(d) for d in ty.shape.values])) * dtype.bits // 8
    return {"total": tir + tensor, "tir": tir, "tensor": tensor}


def _attention_repeat(seq: int, repeat: Optional[int]) -> int:
    if repeat is not None:
        return repeat
    return 10 if seq <= 512 else 5 if seq <= 1024 else 3


def bench_attention(seqs: Sequence[int], heads: int = 12, head_dim: int = 64, repeat: Optional[int] = None,
                    max_seconds: float = 10.0, spin: bool = False, out: Callable[[str], None] = print) -> dict:
    """Per sequence length: ours (fused kernel, our CPU template), torch SDPA and the unfused Relax graph."""
    spinning = set_thread_spinning(spin)
    import tvm
    from tvm import relax

    from ...compile import build
    from ...targets import resolve_target

    target = resolve_target("llvm")
    threads = threads_for(target)
    have_torch = importlib.util.find_spec("torch") is not None
    results = []
    for seq in seqs:
        n = _attention_repeat(seq, repeat)
        rng = np.random.default_rng(seq)
        q, k, v = (rng.standard_normal((1, heads, seq, head_dim)).astype("float32") for _ in range(3))
        ref = _attention_reference(q, k, v)
        fused_mod, unfused_mod = _attention_modules(heads, seq, head_dim)
        score_bytes = heads * seq * seq * 4
        entry = {"seq": seq, "heads": heads, "head_dim": head_dim, "batch": 1, "score_matrix_bytes": score_bytes,
                 "runtimes": []}
        for name, mod in ((OURS, fused_mod), ("unfused relax", unfused_mod)):
            ws = workspace_bytes(mod, target)
            vm = relax.VirtualMachine(build(mod, target, fuse=False), tvm.cpu())
            args = [tvm.runtime.tensor(a) for a in (q, k, v)]
            diff = float(np.abs(vm["main"](*args).numpy() - ref).max())
            timing = time_block(name, lambda: vm["main"](*args), warmup=1, repeat=n, max_seconds=max_seconds)
            entry["runtimes"].append({**timing.to_dict(), "workspace_bytes": ws["total"], "workspace": ws,
                                      "max_abs_diff": diff})
        if have_torch:
            entry["runtimes"].append(torch_attention(q, k, v, ref, threads, n, max_seconds))
        else:
            entry["runtimes"].append({"name": "torch sdpa", "available": False, "note": "n/a (torch not installed)",
                                      "workspace_bytes": None})
        results.append(entry)
        out(format_attention(entry))
    return {"mode": "attention", "target": "llvm", "threads": threads, "heads": heads, "head_dim": head_dim,
            "dtype": "float32", "seqs": list(seqs), "results": results, "threading": spinning,
            "workspace_definition": "bytes allocated besides q, k, v and the output: Relax intermediates + "
                                    "allocations in the scheduled, lowered TIR (sum, an upper bound on peak); "
                                    "torch: not measured",
            "environment": environment()}


def bench_dense(shape: str, act: str = "gelu", repeat: int = 50, spin: bool = False,
                out: Callable[[str], None] = print) -> dict:
    """``fused_dense`` alone (constant weight, so the build pre-packs it; bias + activation epilogue) at
    ``shape`` = "MxKxN": median latency and GFLOP/s with this build path's default knobs, checked vs numpy."""
    spinning = set_thread_spinning(spin)
    import tvm
    from tvm import relax

    from ...compile import build
    from ...ops import call_op
    from ...ops.dense import ACTIVATIONS
    from ...targets import resolve_target

    m, k, n = parse_mkn(shape, "--dense", "128x384x1536")
    if act not in ACTIVATIONS:
        raise InputError(f"unknown activation '{act}' (known: {', '.join(ACTIVATIONS)})")
    target = resolve_target("llvm")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype("float32")
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype("float32")
    b = rng.standard_normal(n).astype("float32")
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType((m, k), "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit_output(call_op(bb, "fused_dense", {"x": xv, "w": relax.const(w), "bias": relax.const(b)},
                                       {"act": act, "transpose_b": False}))
        bb.emit_func_output(y)
    vm = relax.VirtualMachine(build(bb.get(), target, fuse=False), tvm.cpu())
    xt = tvm.runtime.tensor(x)
    diff = float(np.abs(vm["main"](xt).numpy() - numpy_activation(x.astype(np.float64) @ w + b, act)).max())
    timing = time_block(OURS, lambda: vm["main"](xt), warmup=20, repeat=repeat)  # thread pool warm
    gflops = 2.0 * m * k * n / (timing.median * 1e-3) / 1e9
    out(f"fused_dense {m}x{k}x{n} (+bias, {act}), {threads_for(target)} threads: median {timing.median:.3f} ms "
        f"(p10 {timing.p10:.3f}, p90 {timing.p90:.3f}) = {gflops:.1f} GFLOP/s; max |ours - numpy| {diff:.1e}")
    return {"mode": "dense", "shape": [m, k, n], "act": act, "threads": threads_for(target), **timing.to_dict(),
            "gflops": gflops, "max_abs_diff": diff, "threading": spinning, "environment": environment()}


def _attention_reference(q, k, v) -> np.ndarray:
    s = (q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2)) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)



def parse_mkn(shape: str, flag: str, example: str):
    """``(M, K, N)`` from "MxKxN", or one line naming ``flag`` and a valid ``example``."""
    try:
        m, k, n = (int(d) for d in shape.lower().split("x"))
        if min(m, k, n) <= 0:
            raise ValueError
    except ValueError:
        raise InputError(f"{flag} takes MxKxN with positive sizes, e.g. {example} (got '{shape}')") from None
    return m, k, n
