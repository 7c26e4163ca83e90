"""CUDA templates against numpy on a real GPU (skipped without one)."""

import math

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir

from tvm_fusion_ext.ops.registry import make_prim_func
from tvm_fusion_ext.schedules.registry import get_template

pytestmark = pytest.mark.gpu
_erf = np.vectorize(math.erf)


def _np_dtype(dtype):
    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def _run(op, rule, inputs, params, out_shape, out_dtype, gpu):
    dev, target = gpu
    func = make_prim_func(op, {k: relax.TensorType(list(v.shape), d) for k, (v, d) in inputs.items()}, params)
    sch = s_tir.Schedule(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), seed=1)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    block = next(b for b in blocks if str(sch.get(b).annotations.get("schedule_rule", "")) == rule)
    get_template(rule, target)(sch, block, target)
    lib = tvm.compile(sch.mod, target)
    args = [tvm.runtime.tensor(v.astype(_np_dtype(d)), dev) for v, d in inputs.values()]
    out = tvm.runtime.tensor(np.zeros(out_shape, _np_dtype(out_dtype)), dev)
    lib(*args, out)
    return out.numpy().astype("float32")


@pytest.mark.parametrize("dtype,M,K,N,transpose_b,act", [
    ("float32", 128, 384, 1152, False, "gelu"),
    ("float32", 24, 40, 36, True, "none"),
    ("float16", 128, 768, 384, False, "gelu"),
    ("float16", 128, 384, 1536, True, "relu"),
    ("float16", 12, 40, 24, False, "none"),      # SIMT path for fp16
    ("bfloat16", 128, 384, 768, False, "gelu"),
    ("bfloat16", 64, 256, 128, True, "none"),
])
def test_dense(gpu, dtype, M, K, N, transpose_b, act):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, M, K)).astype("float32")
    w = (rng.standard_normal((N, K) if transpose_b else (K, N)) / math.sqrt(K)).astype("float32")
    b = rng.standard_normal(N).astype("float32")
    cast = lambda a: a.astype(_np_dtype(dtype)).astype("float64")  # noqa: E731  (the values the GPU sees)
    got = _run("fused_dense", "tfx.dense", {"x": (x, dtype), "w": (w, dtype), "bias": (b, dtype)},
               {"act": act, "transpose_b": transpose_b}, (1, M, N), dtype, gpu)
    z = cast(x) @ (cast(w).T if transpose_b else cast(w)) + cast(b)
    want = {"none": z, "relu": np.maximum(z, 0), "gelu": 0.5 * z * (1 + _erf(z / math.sqrt(2)))}[act]
    tol = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 8e-2}[dtype]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,N", [("float32", 384), ("float32", 30), ("float16", 768)])
def test_layernorm(gpu, dtype, N):
    rng = np.random.default_rng(1)
    x, r = (rng.standard_normal((1, 64, N)).astype("float32") * 3 + 1 for _ in range(2))
    bias, gamma, beta = (rng.standard_normal(N).astype("float32") for _ in range(3))
    inputs = {"x": (x, dtype), "residual": (r, dtype), "bias": (bias, dtype), "gamma": (gamma, dtype),
              "beta": (beta, dtype)}
    got = _run("fused_layernorm", "tfx.layernorm", inputs, {"eps": 1e-12}, x.shape, dtype, gpu)
    cast = lambda a: a.astype(_np_dtype(dtype)).astype("float64")  # noqa: E731
    h = cast(x) + cast(r) + cast(bias)
    want = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-12) * cast(gamma) + cast(beta)
    tol = 1e-4 if dtype == "float32" else 1e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,S,D,layout", [
    ("float16", 128, 64, "BSHD"),   # tensor cores (when asked), K and V read in place
    ("bfloat16", 128, 32, "BHSD"),
    ("float16", 96, 64, "BSHD"),    # tensor cores (when asked), padded key blocks
    ("float16", 40, 32, "BSHD"),    # rows not a multiple of 16: SIMT either way
])
@pytest.mark.parametrize("tensor_cores", [False, True], ids=["simt", "mma"])
def test_attention_low_precision(gpu, dtype, S, D, layout, tensor_cores, monkeypatch):
    from tvm_fusion_ext.schedules.cuda.attention_mma import OPT_IN

    if get_template("tfx.attention", gpu[1]) is None:
        pytest.skip("no CUDA attention template registered")
    if tensor_cores:  # the opt-in template this test exists to check (schedules/cuda/attention_mma.py)
        monkeypatch.setenv(OPT_IN, "1")
    else:
        monkeypatch.delenv(OPT_IN, raising=False)
    rng = np.random.default_rng(3)
    B, H = 1, 4
    q, k, v = (rng.standard_normal((B, S, H, D)).astype("float32") for _ in range(3))
    mask = np.where(rng.random((B, 1, 1, S)) < 0.8, 0.0, -10000.0).astype("float32")
    to = (lambda a: a) if layout == "BSHD" else (lambda a: a.transpose(0, 2, 1, 3))  # noqa: E731
    scale = 1 / math.sqrt(D)
    params = {"scale": scale, "key_block": min(64, 1 << (S.bit_length() - 1)), **{f"{t}_layout": layout for t in ("q", "k", "v", "out")}}
    got = _run("fused_attention", "tfx.attention", {"q": (to(q), dtype), "k": (to(k), dtype), "v": (to(v), dtype),
                                                      "mask": (mask, dtype)},
               params, to(q).shape, dtype, gpu)
    cast = lambda a: a.astype(_np_dtype(dtype)).astype("float64")  # noqa: E731
    qh, kh, vh = (cast(a).transpose(0, 2, 1, 3) for a in (q, k, v))
    s = qh @ kh.transpose(0, 1, 3, 2) * scale + cast(mask)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = to((p @ vh).transpose(0, 2, 1, 3))
    tol = 2e-2 if dtype == "float16" else 8e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_attention(gpu):
    if get_template("tfx.attention", gpu[1]) is None:
        pytest.skip("no CUDA attention template registered")
    rng = np.random.default_rng(2)
    B, S, H, D = 1, 64, 4, 32
    q, k, v = (rng.standard_normal((B, S, H, D)).astype("float32") for _ in range(3))
    mask = np.where(rng.random((B, 1, 1, S)) < 0.8, 0.0, -10000.0).astype("float32")
    scale = 1 / math.sqrt(D)
    got = _run("fused_attention", "tfx.attention", {"q": (q, "float32"), "k": (k, "float32"),
                                                      "v": (v, "float32"), "mask": (mask, "float32")},
               {"scale": scale}, (B, S, H, D), "float32", gpu)
    qh, kh, vh = (a.transpose(0, 2, 1, 3).astype("float64") for a in (q, k, v))
    s = qh @ kh.transpose(0, 1, 3, 2) * scale + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = (p @ vh).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def symbolic_chain_module():
    """``(module, {input: shape})``: dense + GELU → causal attention → LayerNorm with symbolic batch and sequence
    (also built by ``scripts/gpu_check.py`` for a GPU machine without the TVM compiler)."""
    from tvm import tirx

    from tvm_fusion_ext.ops import call_op
    from tvm_fusion_ext.testing import build_module

    b, s = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    shapes = {"x": [b, s, 256], "w": [256, 256], "bias": [256], "gamma": [256], "beta": [256],
              "mask": [b, 1, 1, s]}
    args = {n: relax.Var(n, relax.TensorType(sh, "float32")) for n, sh in shapes.items()}

    def body(bb):
        h = bb.emit(call_op(bb, "fused_dense", {"x": args["x"], "w": args["w"], "bias": args["bias"]},
                            {"act": "gelu"}))
        heads = bb.emit(relax.op.reshape(h, [b, s, 4, 64]))
        o = bb.emit(call_op(bb, "fused_attention", {"q": heads, "k": heads, "v": heads, "mask": args["mask"]},
                            {"scale": 0.125, "causal": True}))
        o = bb.emit(relax.op.reshape(o, [b, s, 256]))
        return call_op(bb, "fused_layernorm", {"x": o, "residual": args["x"], "gamma": args["gamma"],
                                               "beta": args["beta"]}, {"eps": 1e-5})

    return build_module(list(args.values()), body), shapes


def test_symbolic_kernels_match_cpu_at_every_length(gpu):
    """One CUDA build of kernels whose batch and sequence are symbolic (dense rows padded to row tiles, attention
    queries padded to query tiles, norms over any row count) equals the CPU build (itself checked against
    numpy) at lengths that are not multiples of any tile."""
    from tvm_fusion_ext.compile.pipeline import compile_model

    dev, target = gpu
    mod, shapes = symbolic_chain_module()
    on_gpu = relax.VirtualMachine(compile_model(mod, target, fuse_graph=False).executable, dev)
    on_cpu = relax.VirtualMachine(compile_model(mod, "llvm", fuse_graph=False).executable, tvm.cpu())
    rng = np.random.default_rng(0)
    for batch, seq in ((1, 1), (1, 37), (3, 100)):
        feeds = [rng.standard_normal([batch, seq, 256] if n == "x" else [int(d) for d in sh]).astype("float32")
                 if n != "mask" else np.where(rng.random((batch, 1, 1, seq)) < 0.2, -1e4, 0).astype("float32")
                 for n, sh in shapes.items()]
        got = on_gpu["main"](*[tvm.runtime.tensor(a, dev) for a in feeds]).numpy()
        want = on_cpu["main"](*[tvm.runtime.tensor(a) for a in feeds]).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
