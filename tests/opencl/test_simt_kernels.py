"""Every SIMT CUDA template, compiled for the OpenCL stand-in and run on this CPU by PoCL, against numpy: dense
(fp32, fp16, shapes that tile and shapes that do not), gated dense, LayerNorm, RMSNorm, attention (full, causal,
both layouts, fp16). The schedules are the CUDA ones (same limits, same tiles); tensor cores are off on this
target, so 16-bit shapes that a GPU would put on tensor cores exercise the SIMT paths here."""

import math

import numpy as np
import pytest
from tvm import relax

from tvm_fusion_ext.ops.gated_dense import interleave_weights
from tvm_fusion_ext.ops.registry import make_prim_func
from tvm_fusion_ext.testing import numpy_activation
from tvm_fusion_ext.tools.simt_on_cpu import OpenCLFunction, schedule_prim

TOL = {"float32": 1e-4, "float16": 2e-2}


def _cast(a, dtype):
    """float64 values of ``a`` as a kernel holding ``dtype`` sees them."""
    return a.astype(dtype).astype("float64")


def run_simt(target, op, rule, inputs, params, out_shape, out_dtype):
    """``op`` scheduled by the CUDA template of ``rule``, run on PoCL: the output as float32, and the kernel."""
    func = make_prim_func(op, {k: relax.TensorType(list(v.shape), d) for k, (v, d) in inputs.items()}, params)
    fn = OpenCLFunction(schedule_prim(func, rule, target), target)
    out = np.zeros(out_shape, out_dtype)
    fn(*[v.astype(d) for v, d in inputs.values()], out)
    return out.astype("float32"), fn


@pytest.mark.parametrize("dtype,M,K,N,transpose_b,act", [
    ("float32", 128, 384, 256, False, "gelu"),
    ("float32", 24, 40, 36, True, "none"),       # nothing a multiple of the 4x4 thread tile or of 16
    ("float16", 128, 256, 384, True, "relu"),    # tensor-core shapes on a GPU: the SIMT path here
    ("float16", 12, 40, 24, False, "none"),
])
def test_dense(simt, dtype, M, K, N, transpose_b, act):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, M, K)).astype("float32")
    w = (rng.standard_normal((N, K) if transpose_b else (K, N)) / math.sqrt(K)).astype("float32")
    b = rng.standard_normal(N).astype("float32")
    got, fn = run_simt(simt, "fused_dense", "tfx.dense", {"x": (x, dtype), "w": (w, dtype), "bias": (b, dtype)},
                       {"act": act, "transpose_b": transpose_b}, (1, M, N), dtype)
    z = _cast(x, dtype) @ (_cast(w, dtype).T if transpose_b else _cast(w, dtype)) + _cast(b, dtype)
    np.testing.assert_allclose(got, numpy_activation(z, act), rtol=TOL[dtype], atol=TOL[dtype])
    assert "barrier(CLK_LOCAL_MEM_FENCE)" in fn.source and "__local" in fn.source  # staged in shared memory


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gated_dense(simt, dtype):
    rng = np.random.default_rng(4)
    M, K, N = 64, 96, 128
    x = rng.standard_normal((1, M, K)).astype("float32")
    wg, wu = ((rng.standard_normal((K, N)) / math.sqrt(K)).astype("float32") for _ in range(2))
    got, _ = run_simt(simt, "fused_gated_dense", "tfx.gated_dense", {"x": (x, dtype),
                                                                     "w": (interleave_weights(wg, wu), dtype)},
                      {"act": "silu"}, (1, M, N), dtype)
    xd = _cast(x, dtype)
    want = numpy_activation(xd @ _cast(wg, dtype), "silu") * (xd @ _cast(wu, dtype))
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype,N", [("float32", 384), ("float32", 30), ("float16", 768)])
def test_layernorm(simt, dtype, N):
    rng = np.random.default_rng(1)
    x, r = (rng.standard_normal((1, 64, N)).astype("float32") * 3 + 1 for _ in range(2))
    bias, gamma, beta = (rng.standard_normal(N).astype("float32") for _ in range(3))
    inputs = {"x": (x, dtype), "residual": (r, dtype), "bias": (bias, dtype), "gamma": (gamma, dtype),
              "beta": (beta, dtype)}
    got, _ = run_simt(simt, "fused_layernorm", "tfx.layernorm", inputs, {"eps": 1e-12}, x.shape, dtype)
    h = _cast(x, dtype) + _cast(r, dtype) + _cast(bias, dtype)
    want = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-12) * _cast(gamma, dtype) + \
        _cast(beta, dtype)
    tol = 1e-4 if dtype == "float32" else 1e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,N", [("float32", 256), ("float16", 100)])
def test_rmsnorm(simt, dtype, N):
    rng = np.random.default_rng(5)
    x, r = (rng.standard_normal((2, 24, N)).astype("float32") for _ in range(2))
    gamma = rng.standard_normal(N).astype("float32")
    got, _ = run_simt(simt, "fused_rmsnorm", "tfx.rmsnorm", {"x": (x, dtype), "residual": (r, dtype),
                                                             "gamma": (gamma, dtype)}, {"eps": 1e-6}, x.shape, dtype)
    h = _cast(x, dtype) + _cast(r, dtype)
    want = h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-6) * _cast(gamma, dtype)
    tol = 1e-4 if dtype == "float32" else 1e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def attention_reference(q, k, v, mask, scale, causal):
    """BSHD in, BSHD out; float64."""
    qh, kh, vh = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
    s = qh @ kh.transpose(0, 1, 3, 2) * scale + (mask if mask is not None else 0)
    if causal:
        S, T = s.shape[-2:]
        s = np.where(np.tril(np.ones((S, T), bool), T - S), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True) @ vh).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("dtype,S,D,layout,causal", [
    ("float32", 64, 32, "BSHD", False),
    ("float32", 40, 32, "BSHD", True),     # query tiles that do not divide the rows, causal
    ("float16", 128, 64, "BSHD", False),   # the key block sized for 16-bit inputs
    ("float16", 96, 64, "BHSD", True),
])
def test_attention(simt, dtype, S, D, layout, causal):
    rng = np.random.default_rng(3)
    B, H = 1, 4
    q, k, v = (rng.standard_normal((B, S, H, D)).astype("float32") for _ in range(3))
    mask = np.where(rng.random((B, 1, 1, S)) < 0.8, 0.0, -10000.0).astype("float32")
    to = (lambda a: a) if layout == "BSHD" else (lambda a: a.transpose(0, 2, 1, 3))  # noqa: E731
    scale = 1 / math.sqrt(D)
    params = {"scale": scale, "causal": causal}
    if dtype != "float32":
        params.update(key_block=min(64, 1 << (S.bit_length() - 1)),
                      **{f"{t}_layout": layout for t in ("q", "k", "v", "out")})
    inputs = {"q": (np.ascontiguousarray(to(q)), dtype), "k": (np.ascontiguousarray(to(k)), dtype),
              "v": (np.ascontiguousarray(to(v)), dtype), "mask": (mask, dtype)}
    got, _ = run_simt(simt, "fused_attention", "tfx.attention", inputs, params, to(q).shape, dtype)
    want = to(attention_reference(*(_cast(a, dtype) for a in (q, k, v)), _cast(mask, dtype), scale, causal))
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype])


def test_a_write_out_of_bounds_is_reported(simt):
    """The guard zones around every buffer: a kernel whose last block writes past its 64-row output (three blocks of
    32 threads, no predicate) fails with the buffer named, where a GPU may write there silently."""
    import tvm
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def main(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):  # noqa: F821  (TVMScript)
        for bx in T.thread_binding(3, thread="blockIdx.x"):
            for tx in T.thread_binding(32, thread="threadIdx.x"):
                with T.sblock("B"):
                    i = T.axis.spatial(96, bx * 32 + tx)
                    B[i] = A[T.min(i, 63)] + T.float32(1)

    fn = OpenCLFunction(tvm.IRModule({"main": main}), simt)
    with pytest.raises(AssertionError, match="after the bounds of buffer 'B'"):
        fn(np.ones(64, "float32"), np.zeros(64, "float32"))


def test_targets_say_where_tensor_cores_are(simt):
    from tvm_fusion_ext.targets import TargetInfo, cuda_target

    assert TargetInfo.of(simt).family == "cuda" and not TargetInfo.of(simt).tensor_cores
    assert TargetInfo.of(cuda_target("sm_80")).tensor_cores and not TargetInfo.of(cuda_target("sm_75")).tensor_cores
    assert TargetInfo.of(simt).limits() == TargetInfo.of(cuda_target("sm_90")).limits() | {"warp": 1}
