"""Numerics of every CUDA template, built here and checked there with the runtime only (the campaign's
``numerics`` part; ``scripts/gpu_check.py`` is this part alone, its command line unchanged).

``build`` compiles the cases of ``tests/gpu/`` (the CUDA templates one kernel at a time: dense fp32 / fp16 / bf16
with tensor cores and SIMT, the int8 dense (u8 × s8 tensor cores, int32 accumulation) on quantised inputs,
bias + residual + LayerNorm, attention fp32 / fp16 / bf16, each 16-bit attention also through the opt-in
tensor-core template, the split-K decode attention (one query row, GQA / MQA, padded pasts), and a symbolic
attention whose one-row requests branch to it; a symbolic-shape chain of dense → causal attention → LayerNorm
through the Relax VM; the packed varlen attention; the gated MLP's pair in ``precision`` int8 and bf16, as the
compile path builds it (row quantisation, one dense over the gate's and up projection's columns side by side,
the gate product), through the VM) with ``export_library`` into ``DIR``, with the reference each
case must match (numpy in float64 on the values the GPU sees, or the CPU build for the VM chain), its inputs (the
dense cases' are drawn there from their seed instead: only their CRC-32s travel) and a ``cases.json`` index. ``arch="llvm"`` builds the float32 cases for this CPU instead, so that the run side is
exercised here by a runtime-only process before a GPU ever sees it. ``run`` needs only ``tvm.runtime``, numpy and
torch: it loads each library, feeds the inputs (cast by torch, so bf16 needs no ml_dtypes), compares with the
reference at the test's tolerance, times the single-kernel cases with TVM's ``time_evaluator`` against torch's
kernels for the same op (cuBLAS ``linear``, ``layer_norm``, SDPA) and writes one JSON. A case that fails is
recorded with its error, not fatal.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]  # the checkout (tests/ holds the case definitions)


# -- build (here) -------------------------------------------------------------------------------------------------
def _cast(a, dtype):
    """float64 values of ``a`` as the GPU holds them in ``dtype``."""
    if dtype == "bfloat16":
        import ml_dtypes

        return a.astype(ml_dtypes.bfloat16).astype("float64")
    return a.astype(dtype).astype("float64")


def _gelu(z):
    return 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))


def _attention_ref(q, k, v, mask, scale, causal=False):
    qh, kh, vh = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
    s = qh @ kh.transpose(0, 1, 3, 2) * scale + mask
    if causal:
        S = s.shape[-1]
        s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ vh).transpose(0, 2, 1, 3)


# -- inputs drawn on both sides -----------------------------------------------------------------------------------
# The dense cases' weights are most of what the numerics part would carry: their inputs are drawn there from the same
# seed by the functions below (numpy's ``default_rng`` gives the same numbers on both sides), and only the reference
# and a CRC-32 of each drawn input travel, so that a numpy whose stream differs fails the case in one line instead of
# comparing against a reference of other inputs. The other cases' inputs are small and carried, 16-bit ones in 16 bits.
def dense_inputs(M, K, N, tb, seed=0):
    """x [1, M, K], w [N, K] (``tb``) or [K, N] scaled by 1/sqrt(K), bias [N], all float32."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, M, K)).astype("float32")
    w = (rng.standard_normal((N, K) if tb else (K, N)) / math.sqrt(K)).astype("float32")
    b = rng.standard_normal(N).astype("float32")
    return x, w, b


def int8_dense_inputs(M, K, N):
    """x (u8), x_scale, x_zero, w (s8, [N, K]), w_scale, w_sum, bias: the quantised dense's operands."""
    rng = np.random.default_rng(M + K + N)
    x = rng.integers(0, 256, (1, M, K)).astype("uint8")
    x_zero = rng.integers(0, 256, (1, M, 1)).astype("int32")
    x_scale = rng.uniform(0.01, 0.05, (1, M, 1)).astype("float32")
    w = rng.integers(-127, 128, (N, K)).astype("int8")
    w_scale = rng.uniform(0.5, 2.0, N).astype("float32") / np.float32(127 * math.sqrt(K))
    w_sum = w.astype("int32").sum(axis=1).astype("int32")
    b = rng.standard_normal(N).astype("float32")
    return x, x_scale, x_zero, w, w_scale, w_sum, b


#: draw name → the function that draws a case's inputs (both sides)
DRAWS = {"dense": dense_inputs, "int8_dense": int8_dense_inputs}
#: case name → ``{"draw", "args"}``, filled by the case lists: the cases whose inputs are drawn there
DRAWN = {}


def _crc(a) -> int:
    import zlib

    return zlib.crc32(np.ascontiguousarray(a).tobytes())


def _carried(a, dtype):
    """``a`` as carried: float16 cases' float32 values in float16 (exact: the values are rounded to it there anyway)."""
    return a.astype("float16") if dtype == "float16" and a.dtype == np.float32 else a


def drawn_inputs(recipe):
    """The inputs of a case drawn here, checked against the build's CRC-32s."""
    arrays = DRAWS[recipe["draw"]](*recipe["args"])
    got = [_crc(a) for a in arrays]
    if got != recipe["crc32"]:
        raise RuntimeError(f"inputs drawn by numpy {np.__version__} differ from the build's "
                           f"(draw {recipe['draw']}{tuple(recipe['args'])}): the reference does not apply")
    return list(arrays)


def _prim_cases():
    """``(name, op, rule, inputs {name: (float32 array, dtype)}, params, out shape, out dtype, reference, tol,
    torch op)``: the single-kernel cases of tests/gpu/test_cuda_numerics.py."""
    cases = []
    for dtype, M, K, N, tb, act in [("float32", 128, 384, 1152, False, "gelu"), ("float32", 24, 40, 36, True, "none"),
                                    ("float16", 128, 768, 384, False, "gelu"),
                                    ("float16", 128, 384, 1536, True, "relu"), ("float16", 12, 40, 24, False, "none"),
                                    ("bfloat16", 128, 384, 768, False, "gelu"),
                                    ("bfloat16", 64, 256, 128, True, "none")]:
        x, w, b = dense_inputs(M, K, N, tb)
        z = _cast(x, dtype) @ (_cast(w, dtype).T if tb else _cast(w, dtype)) + _cast(b, dtype)
        want = {"none": z, "relu": np.maximum(z, 0), "gelu": _gelu(z)}[act]
        tol = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 8e-2}[dtype]
        name = f"dense_{dtype}_{M}x{K}x{N}_{'tb_' if tb else ''}{act}"
        DRAWN[name] = {"draw": "dense", "args": [M, K, N, tb]}
        cases.append((name, "fused_dense", "tfx.dense",
                      {"x": (x, dtype), "w": (w, dtype), "bias": (b, dtype)}, {"act": act, "transpose_b": tb},
                      (1, M, N), dtype, want, tol, {"op": "dense", "act": act, "transpose_b": tb}))
    for dtype, N in [("float32", 384), ("float32", 30), ("float16", 768)]:
        rng = np.random.default_rng(1)
        x, r = (rng.standard_normal((1, 64, N)).astype("float32") * 3 + 1 for _ in range(2))
        bias, gamma, beta = (rng.standard_normal(N).astype("float32") for _ in range(3))
        h = _cast(x, dtype) + _cast(r, dtype) + _cast(bias, dtype)
        want = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-12) * _cast(gamma, dtype) + \
            _cast(beta, dtype)
        cases.append((f"layernorm_{dtype}_64x{N}", "fused_layernorm", "tfx.layernorm",
                      {"x": (x, dtype), "residual": (r, dtype), "bias": (bias, dtype), "gamma": (gamma, dtype),
                       "beta": (beta, dtype)}, {"eps": 1e-12}, x.shape, dtype, want,
                      1e-4 if dtype == "float32" else 1e-2, {"op": "layernorm", "eps": 1e-12}))
    for dtype, S, D, layout in [("float32", 64, 32, "BSHD"), ("float16", 128, 64, "BSHD"),
                                ("bfloat16", 128, 32, "BHSD"), ("float16", 96, 64, "BSHD"),
                                ("float16", 40, 32, "BSHD")]:
        rng = np.random.default_rng(3 if dtype != "float32" else 2)
        B, H = 1, 4
        q, k, v = (rng.standard_normal((B, S, H, D)).astype("float32") for _ in range(3))
        mask = np.where(rng.random((B, 1, 1, S)) < 0.8, 0.0, -10000.0).astype("float32")
        to = (lambda a: a) if layout == "BSHD" else (lambda a: a.transpose(0, 2, 1, 3))  # noqa: E731
        scale = 1 / math.sqrt(D)
        params = {"scale": scale}
        if dtype != "float32":
            params.update(key_block=min(64, 1 << (S.bit_length() - 1)), **{f"{t}_layout": layout for t in ("q", "k", "v", "out")})
        want = to(_attention_ref(*(_cast(a, dtype) for a in (q, k, v)), _cast(mask, dtype), scale))
        tol = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 8e-2}[dtype]
        cases.append((f"attention_{dtype}_S{S}_D{D}_{layout}", "fused_attention", "tfx.attention",
                      {"q": (np.ascontiguousarray(to(q)), dtype), "k": (np.ascontiguousarray(to(k)), dtype),
                       "v": (np.ascontiguousarray(to(v)), dtype), "mask": (mask, dtype)}, params, to(q).shape,
                      dtype, want, tol, {"op": "attention", "layout": layout, "scale": scale}))
    return cases


def int8_dense_cases():
    """The int8 dense of ``precision="int8"`` (``fused_dense_int8``, weight (N, K) as CUDA builds store it) on
    already-quantised inputs, in the tuple form of :func:`_prim_cases`: u8 activations × s8 weights on tensor
    cores (the first three: MiniLM's QKV, FFN up and a decode-sized LLaMA projection) and on the SIMT dense (rows
    not a multiple of 16). The integer dot product is exact (numpy int64), so the reference leaves only the fp32
    epilogue's rounding and the tolerance is tight. The torch peer is cuBLAS's fp16 ``linear`` of the same shape,
    the dense int8 stands in for."""
    cases = []
    for M, K, N, act in [(128, 384, 1152, "none"), (128, 384, 1536, "gelu"), (16, 2048, 1024, "none"),
                         (20, 64, 48, "relu")]:
        x, x_scale, x_zero, w, w_scale, w_sum, b = int8_dense_inputs(M, K, N)
        acc = x[0].astype(np.int64) @ w.T.astype(np.int64) - x_zero[0].astype(np.int64) * w_sum.astype(np.int64)
        z = (acc * (x_scale[0].astype("float64") * w_scale.astype("float64")) + b)[None]
        want = {"none": z, "relu": np.maximum(z, 0), "gelu": _gelu(z)}[act]
        inputs = {"x": (x, "uint8"), "x_scale": (x_scale, "float32"), "x_zero": (x_zero, "int32"), "w": (w, "int8"),
                  "w_scale": (w_scale, "float32"), "w_sum": (w_sum, "int32"), "bias": (b, "float32")}
        DRAWN[f"dense_int8_{M}x{K}x{N}_{act}"] = {"draw": "int8_dense", "args": [M, K, N]}
        cases.append((f"dense_int8_{M}x{K}x{N}_{act}", "fused_dense_int8", "tfx.dense", inputs,
                      {"act": act, "transpose_b": True}, (1, M, N), "float32", want, 1e-4,
                      {"op": "dense_int8", "act": act}))
    return cases


def _decode_ref(q, k, v, mask, scale):
    """softmax(scale · q kᵀ + mask) v for q [B, 1, H, D], k / v [B, T, Hkv, D] (K/V head ``h // group`` serves
    query head h); every row here sees at least the new key."""
    group = q.shape[2] // k.shape[2]
    kk, vv = (np.repeat(a, group, axis=2) for a in (k, v))
    s = np.einsum("bshd,bthd->bhst", q, kk) * scale + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhst,bthd->bshd", p, vv)


def decode_attention_cases():
    """The split-K decode attention (``tfx.decode_attention``, one query row per head, the CUDA template's tiles) in
    the tuple form of :func:`_prim_cases`: P cached keys plus the new one at P = 0, 7, 129 (a padded and a
    left-padded past from the mask) and 1000, MHA / GQA 4 / MQA, head dims 64 and 128, fp32 and fp16. The torch
    peer is SDPA with one query row (K/V heads repeated for it)."""
    from tvm_fusion_ext.schedules.cuda.decode_attention import cuda_decode_params

    cases = []
    # small enough to carry: the inputs travel as .npz (16-bit cases in 16 bits), under 1 MiB for all five
    for dtype, B, H, HKV, P, D, pad in [("float16", 2, 4, 4, 0, 64, None), ("float32", 1, 8, 2, 7, 128, None),
                                        ("float16", 2, 8, 2, 129, 128, "right"),
                                        ("float32", 2, 8, 2, 129, 64, "left"), ("float16", 1, 8, 1, 1000, 64, None)]:
        rng = np.random.default_rng(P + H)
        q = rng.standard_normal((B, 1, H, D)).astype("float32")
        k, v = (rng.standard_normal((B, P + 1, HKV, D)).astype("float32") for _ in range(2))
        mask = np.zeros((B, 1, 1, P + 1), "float32")
        for b in range(B if pad else 0):  # sequence b's past has (P * b) // (2 B) padding positions
            n = (P * b) // (2 * B)
            if n:
                mask[b, ..., :n] = -np.inf if pad == "left" else 0.0
                mask[b, ..., P - n:P] = -np.inf if pad == "right" else mask[b, ..., P - n:P]
        scale = D ** -0.5
        want = _decode_ref(*(_cast(a, dtype) for a in (q, k, v, mask)), scale)
        tol = {"float32": 1e-4, "float16": 2e-2}[dtype]
        cases.append((f"decode_attention_{dtype}_B{B}_H{H}_KV{HKV}_P{P}_D{D}{'_' + pad if pad else ''}",
                      "fused_attention", "tfx.decode_attention",
                      {n: (a.astype(dtype), dtype) for n, a in (("q", q), ("k", k), ("v", v), ("mask", mask))},
                      cuda_decode_params({"scale": scale}, P + 1), q.shape, dtype, want, tol,
                      {"op": "attention", "layout": "BSHD", "scale": scale}))
    return cases


def _decode_dispatch(target, out_dir):
    """tests/opencl/test_simt_decode_dispatch.py as one VM library: a symbolic GQA attention whose one-row requests
    take the decode kernels (the host's ``if rows == 1``), at several cache lengths and one prefill chunk."""
    sys.path.insert(0, str(ROOT / "tests" / "compile"))
    import test_decode_dispatch as helpers

    from tvm_fusion_ext.compile.pipeline import compile_model

    mod = helpers._module({"scale": 0.125, "causal": True})
    compile_model(mod, target, fuse_graph=False).executable.export_library(str(out_dir / "decode_dispatch.so"))
    entries = []
    for batch, rows, past, pad in ((2, 1, 0, None), (1, 1, 7, None), (2, 1, 129, (0, 129)), (1, 1, 300, None),
                                   (2, 5, 20, None)):
        feeds = helpers._inputs(batch, rows, past, seed=past + rows, pad=pad)
        want = helpers._reference(*feeds, 0.125)
        name = f"decode_dispatch_b{batch}_rows{rows}_past{past}"
        np.savez_compressed(out_dir / f"{name}.npz", want=np.asarray(want, "float32"),
                 **{f"in{i}": a for i, a in enumerate(feeds)})
        entries.append({"name": name, "kind": "vm", "library": "decode_dispatch.so", "tol": 1e-4})
    return entries


def _torch_int8_dense_peer(torch, spec, tensors):
    """What the int8 dense replaces: cuBLAS's fp16 ``linear`` (fp32 on a CPU rehearsal) of the same shape."""
    F = torch.nn.functional
    dtype = torch.float16 if tensors[0].is_cuda else torch.float32
    x, w, b = tensors[0].to(dtype), tensors[3].to(dtype), tensors[6].to(dtype)
    act = {"none": lambda z: z, "relu": F.relu, "gelu": F.gelu}[spec["act"]]
    return lambda: act(F.linear(x, w, b))


def _build_prim(case, target, out_dir):
    import tvm
    from tvm import relax, s_tir

    from tvm_fusion_ext.ops.registry import make_prim_func
    from tvm_fusion_ext.schedules.registry import get_template

    name, op, rule, inputs, params, out_shape, out_dtype, want, tol, torch_op = case
    func = make_prim_func(op, {k: relax.TensorType(list(v.shape), d) for k, (v, d) in inputs.items()}, params)
    sch = s_tir.Schedule(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), seed=1)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    block = next(b for b in blocks if str(sch.get(b).annotations.get("schedule_rule", "")) == rule)
    get_template(rule, target)(sch, block, target)
    with target:
        lib = tvm.compile(sch.mod, target)
    lib.export_library(str(out_dir / f"{name}.so"))
    entry = {"name": name, "kind": "prim", "dtypes": [d for _, d in inputs.values()], "out_shape": list(out_shape),
             "out_dtype": out_dtype, "tol": tol, "torch": torch_op}
    recipe = DRAWN.get(name.removesuffix("_mma"))
    if recipe:  # drawn there: only the reference travels
        entry["draw"] = dict(recipe, crc32=[_crc(v) for v, _ in inputs.values()])
        arrays = {}
    else:
        arrays = {f"in{i}": _carried(v, d) for i, (v, d) in enumerate(inputs.values())}
    np.savez_compressed(out_dir / f"{name}.npz", want=want.astype("float32"), **arrays)
    return entry


def _symbolic_chain(target, out_dir):
    """tests/gpu/test_cuda_numerics.py::test_symbolic_kernels_match_cpu_at_every_length, as one VM library."""
    import tvm
    from tvm import relax

    from tvm_fusion_ext.compile.pipeline import compile_model

    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    from test_cuda_numerics import symbolic_chain_module

    mod, shapes = symbolic_chain_module()
    compile_model(mod, target, fuse_graph=False).executable.export_library(str(out_dir / "symbolic_chain.so"))
    on_cpu = relax.VirtualMachine(compile_model(mod, "llvm", fuse_graph=False).executable, tvm.cpu())
    rng = np.random.default_rng(0)
    entries = []
    for batch, seq in ((1, 1), (1, 37), (3, 100)):
        feeds = [rng.standard_normal([batch, seq, 256] if n == "x" else [int(d) for d in sh]).astype("float32")
                 if n != "mask" else np.where(rng.random((batch, 1, 1, seq)) < 0.2, -1e4, 0).astype("float32")
                 for n, sh in shapes.items()]
        want = on_cpu["main"](*[tvm.runtime.tensor(a) for a in feeds]).numpy()
        name = f"symbolic_chain_b{batch}_s{seq}"
        np.savez_compressed(out_dir / f"{name}.npz", want=want, **{f"in{i}": a for i, a in enumerate(feeds)})
        entries.append({"name": name, "kind": "vm", "library": "symbolic_chain.so", "tol": 1e-4})
    return entries


def _varlen(target, out_dir, dtypes=("float32", "float16")):
    """tests/gpu/test_cuda_varlen_numerics.py, as VM libraries."""
    sys.path.insert(0, str(ROOT / "tests" / "ops"))
    sys.path.insert(0, str(ROOT / "tests" / "cuda"))
    from test_attention_varlen import packed_inputs, reference
    from test_cuda_varlen import packed_attention_module

    from tvm_fusion_ext.compile.pipeline import compile_model

    entries = []
    for dtype, causal, kv_heads, tol in (("float32", False, 4, 3e-5), ("float32", True, 2, 3e-5),
                                         ("float16", False, 4, 2e-2)):
        if dtype not in dtypes:
            continue
        lib = f"varlen_{dtype}_{'causal' if causal else 'full'}_kv{kv_heads}.so"
        compiled = compile_model(packed_attention_module(dtype, causal, kv_heads=kv_heads), target, fuse_graph=False)
        compiled.executable.export_library(str(out_dir / lib))
        for lengths, span in (([1, 64, 17, 0, 33], 64), ([64], 64), ([5, 1, 16, 3], 16)):
            arrays = packed_inputs(lengths, span, kv_heads, seed=sum(lengths), head_dim=64)
            arrays = [a.astype(dtype) if a.dtype == np.float32 else a for a in arrays]
            want = reference(*[a.astype("float32") if a.dtype.kind == "f" else a for a in arrays[:4]],
                             arrays[5].astype("float32"), 0.125, causal)
            name = f"{lib[:-3]}_{'-'.join(map(str, lengths))}"
            np.savez_compressed(out_dir / f"{name}.npz", want=np.asarray(want, "float32"),
                     **{f"in{i}": a for i, a in enumerate(arrays)})
            entries.append({"name": name, "kind": "vm", "library": lib, "tol": tol})
    return entries


#: the gated pairs in low precision: (rows, K, N, act); the first takes the tensor cores, the second the SIMT dense
#: (nothing a multiple of a tile), the third (rows symbolic, run at 1 and 17) the fallback schedule's int8 dense
GATED_PAIRS = [((32,), 256, 352, "silu"), ((13,), 37, 40, "gelu"), (("seq",), 64, 48, "silu")]


def _gated_pairs(target, out_dir, precisions=("int8", "bf16")):
    """tests/gpu/test_cuda_precision_numerics.py's gated pairs, as VM libraries, against the numpy twins of the
    quantised (int8) or bf16-rounded computation. int8's tolerance leaves room for a value on a rounding boundary
    of ``x / scale`` landing one step apart (fast-math division)."""
    import tvm

    sys.path.insert(0, str(ROOT / "tests" / "compile"))
    from test_precision_gated import _fp32, _gated_module, _twin

    from tvm_fusion_ext.compile.pipeline import compile_model

    entries = []
    for precision in precisions:
        for n, (rows, K, N, act) in enumerate(GATED_PAIRS):
            shape = tuple(tvm.tirx.Var(r, "int64") if isinstance(r, str) else r for r in rows)
            mod, wg, wu, b = _gated_module(shape, K, N, act, seed=n)
            lib = f"gated_{precision}_{'x'.join(map(str, rows))}x{K}x{N}_{act}.so"
            compile_model(mod, target, fuse_graph=False, precision=precision).executable.export_library(
                str(out_dir / lib))
            for run_rows in ((1,), (17,)) if isinstance(rows[0], str) else (rows,):
                x = (np.random.default_rng(K + run_rows[0]).standard_normal((*run_rows, K)) + 0.3).astype("float32")
                if precision == "int8":
                    want = _twin(x, wg, wu, b, act)
                else:
                    want = _fp32(_cast(x, "bfloat16"), _cast(wg, "bfloat16"), _cast(wu, "bfloat16"), b, act)
                name = f"{lib[:-3]}_rows{run_rows[0]}"
                np.savez_compressed(out_dir / f"{name}.npz", want=np.asarray(want, "float32"), in0=x)
                entries.append({"name": name, "kind": "vm", "library": lib,
                                "tol": 5e-3 if precision == "int8" else 1e-3})
    return entries


def build(out_dir: Path, arch: str) -> None:
    from .target import campaign_target

    target = campaign_target(arch)
    on_cpu = arch == "llvm"
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = []
    from tvm_fusion_ext.schedules.cuda.attention_mma import OPT_IN

    for case in _prim_cases() + int8_dense_cases() + decode_attention_cases():
        if on_cpu and case[6] != "float32":
            continue  # the CPU rehearsal: the float32 cases exercise the same run-side code
        cases.append(_build_prim(case, target, out_dir))
        print("built", cases[-1]["name"], flush=True)
        if not on_cpu and case[2] == "tfx.attention" and case[6] != "float32":  # the opt-in tensor-core template too
            os.environ[OPT_IN] = "1"
            try:
                cases.append(_build_prim((case[0] + "_mma",) + tuple(case[1:]), target, out_dir))
            finally:
                del os.environ[OPT_IN]
            print("built", cases[-1]["name"], flush=True)
    cases += _symbolic_chain(target, out_dir)
    cases += _decode_dispatch(target, out_dir)
    cases += _varlen(target, out_dir, dtypes=("float32",) if on_cpu else ("float32", "float16"))
    cases += _gated_pairs(target, out_dir)
    (out_dir / "cases.json").write_text(json.dumps({"arch": arch, "cases": cases}, indent=1))
    print(f"{len(cases)} cases in {out_dir}")


# -- run (on the GPU machine: tvm.runtime, numpy, torch only) -----------------------------------------------------
def _torch_dtype(torch, dtype):
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "uint8": torch.uint8,
            "int8": torch.int8, "int32": torch.int32}[dtype]


def _on_gpu(torch, a, dtype=None):
    """``a`` on the run's device (CUDA, or the CPU for a rehearsal build) as ``dtype``."""
    t = torch.from_numpy(np.ascontiguousarray(a)).to(TORCH_DEVICE[0])
    if TORCH_DEVICE[0] == "cpu":
        t = t.clone()  # numpy's buffer may not be 64-byte aligned, which TVM requires; torch's allocator's is
    return t.to(_torch_dtype(torch, dtype)) if dtype else t


TORCH_DEVICE = ["cuda"]


def torch_time(torch, fn, number=50):
    """Seconds per call of ``fn``: the best of 3 loops of ``number`` calls, timed by CUDA events on a GPU (the
    same many-calls-per-figure scheme as TVM's time_evaluator), by the clock on the CPU."""
    if TORCH_DEVICE[0] == "cpu":
        fn()
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(number):
                fn()
            best = min(best, (time.perf_counter() - start) / number)
        return best
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(number):
            fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / number / 1e3)
    return best


def _torch_op(torch, spec, tensors):
    F = torch.nn.functional
    if spec["op"] == "dense_int8":
        return _torch_int8_dense_peer(torch, spec, tensors)
    if spec["op"] == "dense":
        x, w, b = (list(tensors) + [None])[:3]  # bias optional
        act = {"none": lambda z: z, "relu": F.relu, "gelu": F.gelu}[spec["act"]]
        return lambda: act(F.linear(x, w if spec["transpose_b"] else w.t(), b))
    if spec["op"] == "layernorm":
        x, r, b, g, beta = tensors
        return lambda: F.layer_norm(x + r + b, (x.shape[-1],), g, beta, spec["eps"])
    q, k, v, mask = tensors
    to_bhsd = (lambda a: a.transpose(1, 2)) if spec["layout"] == "BSHD" else (lambda a: a)  # noqa: E731
    return lambda: F.scaled_dot_product_attention(to_bhsd(q), to_bhsd(k), to_bhsd(v), attn_mask=mask,
                                                  scale=spec["scale"])


def run(in_dir: Path, json_out: Path, save_outputs: bool = False) -> int:
    import torch
    import tvm
    from tvm.runtime.vm import VirtualMachine

    from .device import run_device

    index = json.loads((in_dir / "cases.json").read_text())
    dev, TORCH_DEVICE[0], device_name = run_device(index["arch"])
    results = {"device": device_name, "arch": index["arch"], "tvm": tvm.__version__,
               "torch": torch.__version__, "cases": []}
    libraries = {}
    failed = 0
    save = {} if save_outputs else None
    for case in index["cases"]:
        row = {"name": case["name"]}
        try:
            data = np.load(in_dir / f"{case['name']}.npz")
            inputs = (drawn_inputs(case["draw"]) if "draw" in case else
                      [data[f"in{i}"] for i in range(len([k for k in data.files if k.startswith("in")]))])
            want = data["want"]
            if case["kind"] == "prim":
                lib = tvm.runtime.load_module(str(in_dir / f"{case['name']}.so"))
                tensors = [_on_gpu(torch, a, d) for a, d in zip(inputs, case["dtypes"])]
                out = torch.zeros(case["out_shape"], dtype=_torch_dtype(torch, case["out_dtype"]),
                                  device=TORCH_DEVICE[0])
                args = [tvm.runtime.from_dlpack(t) for t in tensors] + [tvm.runtime.from_dlpack(out)]
                lib["main"](*args)
                dev.sync()
                got = out.float().cpu().numpy()
                try:  # timings are extra: a failure here leaves the numerics standing
                    timer = lib.time_evaluator("main", dev, number=50, repeat=3)
                    row["ours_s"] = float(min(timer(*args).results))
                    row["torch_s"] = torch_time(torch, _torch_op(torch, case["torch"], tensors))
                    row["ours_over_torch"] = row["ours_s"] / row["torch_s"]
                except Exception as e:  # noqa: BLE001
                    row["timing_error"] = f"{type(e).__name__}: {e}"[:200]
            else:
                if case["library"] not in libraries:
                    libraries[case["library"]] = VirtualMachine(
                        tvm.runtime.load_module(str(in_dir / case["library"])), dev)
                vm = libraries[case["library"]]
                got = vm["main"](*[tvm.runtime.tensor(a, dev) for a in inputs]).numpy().astype("float32")
            if save is not None:
                save[case["name"]] = got
            diff = np.abs(got.astype("float64") - want.astype("float64"))
            close = np.isclose(got, want, rtol=case["tol"], atol=case["tol"])
            row.update(max_abs_err=float(diff.max()), tol=case["tol"], ok=bool(close.all()),
                       bad_fraction=float(1 - close.mean()), nan_fraction=float(np.isnan(got).mean()))
            if not close.all():  # where the wrong values are: a tile, a tail, everything
                bad = np.argwhere(~close)
                row["first_bad"], row["last_bad"] = bad[0].tolist(), bad[-1].tolist()
        except Exception as e:  # noqa: BLE001  (recorded, the other cases still run)
            import traceback

            if not failed:
                traceback.print_exc()  # the first failure in full
            row.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
        failed += not row["ok"]
        results["cases"].append(row)
        print(json.dumps(row), flush=True)
    results["passed"] = len(results["cases"]) - failed
    results["failed"] = failed
    json_out.write_text(json.dumps(results, indent=1))
    if save:
        np.savez(json_out.with_suffix(".outputs.npz"), **save)  # what each case returned, to study a failure here
    print(f"{results['passed']} passed, {failed} failed on {results['device']}")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("build")
    b.add_argument("dir")
    b.add_argument("--arch", default="sm_90")
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("--json", default="gpu_check.json")
    r.add_argument("--save-outputs", action="store_true", help="also write every case's output beside the JSON")
    args = ap.parse_args()
    if args.mode == "build":
        t = time.time()
        build(Path(args.dir), args.arch)
        print(f"built in {time.time() - t:.0f} s")
        return 0
    return run(Path(args.dir), Path(args.json), args.save_outputs)


if __name__ == "__main__":
    sys.exit(main())
