"""float16 matmuls, convolutions and summing reductions that no rule fused (``compile/lowering/low_precision.py``) accumulate in float32, as
the package's own operators and ONNX Runtime do: against a float64 numpy reference, the error is that of the
float16 output's rounding, several times below TVM's own lowering (a float16 ``te.sum``, whose error grows with
the reduction length). Also: float32 and explicitly widened calls are left alone, and CUDA builds compile."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from tvm_fusion_ext.compile.lowering.low_precision import AccumulateInFloat32
from tvm_fusion_ext.runtime import CompiledModel
from tvm_fusion_ext.testing import build_module

K = 2048


def _matmul(dtype="float16", out_dtype=None):
    a = relax.Var("a", relax.TensorType([4, K], dtype))
    b = relax.Var("b", relax.TensorType([K, 8], dtype))
    kw = {"out_dtype": out_dtype} if out_dtype else {}
    return build_module([a, b], lambda bb: relax.op.matmul(a, b, **kw))


def _conv(dtype="float16"):
    x = relax.Var("x", relax.TensorType([1, 64, 10, 10], dtype))
    w = relax.Var("w", relax.TensorType([8, 64, 5, 5], dtype))  # a reduction of 64·5·5 = 1600
    return build_module([x, w], lambda bb: relax.op.nn.conv2d(x, w, strides=[2, 2]))


def _reduction(op):
    x = relax.Var("x", relax.TensorType([2, 4096], "float16"))
    build = {"sum": lambda bb: relax.op.sum(x, axis=[1]), "mean": lambda bb: relax.op.mean(x, axis=[1]),
             "softmax": lambda bb: relax.op.nn.softmax(x, axis=-1)}[op]
    return build_module([x], build)


def _reduction_reference(op, x):
    x = x.astype(np.float64)
    if op == "softmax":
        e = np.exp(x - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    return x.sum(1) if op == "sum" else x.mean(1)


def _run(mod, inputs, widen=True, monkeypatch=None):
    """The module built by the package's pipeline (fusion off: stock ops only), run on the CPU."""
    from tvm_fusion_ext.compile.pipeline import compile_model

    if not widen:  # TVM's own lowering, for the comparison that shows what the pass buys
        import tvm_fusion_ext.compile.lowering.low_precision as lp

        monkeypatch.setattr(lp, "AccumulateInFloat32", lambda: tvm.transform.Sequential([]))
    compiled = compile_model(mod, None, fuse_graph=False)
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()


def _conv_reference(x, w):
    x, w = x.astype(np.float64), w.astype(np.float64)
    out = np.zeros((1, 8, 3, 3))
    for i in range(3):
        for j in range(3):
            out[0, :, i, j] = np.einsum("chw,ochw->o", x[0, :, 2 * i:2 * i + 5, 2 * j:2 * j + 5], w)
    return out


@pytest.mark.parametrize("case", ["matmul", "conv2d"])
def test_float16_accumulates_in_float32(case, monkeypatch):
    rng = np.random.default_rng(0)
    if case == "matmul":
        mod, inputs = _matmul(), [rng.uniform(0, 1, (4, K)).astype("float16"), rng.uniform(0, 1, (K, 8)).astype("float16")]
        ref = inputs[0].astype(np.float64) @ inputs[1].astype(np.float64)
    else:
        mod = _conv()
        inputs = [rng.uniform(0, 1, (1, 64, 10, 10)).astype("float16"), rng.uniform(0, 1, (8, 64, 5, 5)).astype("float16")]
        ref = _conv_reference(*inputs)
    widened = _run(mod, inputs)
    assert widened.dtype == np.float16
    err = np.abs(widened.astype(np.float64) - ref).max() / np.abs(ref).max()
    assert err <= 2 ** -11, err  # the float16 output's own rounding, nothing more
    stock = _run(mod, inputs, widen=False, monkeypatch=monkeypatch)
    stock_err = np.abs(stock.astype(np.float64) - ref).max() / np.abs(ref).max()
    assert stock_err > 4 * err, (stock_err, err)  # what a float16 te.sum loses over K = 2048 / 1600


@pytest.mark.parametrize("op", ["sum", "mean", "softmax"])
def test_float16_reductions_sum_in_float32(op, monkeypatch):
    """A float16 softmax over 4,096 keys was 26 % off in TVM's lowering (each exp added to a float16 running sum
    near 2,048, whose step is 2)."""
    x = np.random.default_rng(0).uniform(0, 1, (2, 4096)).astype("float16")
    ref = _reduction_reference(op, x)
    widened = _run(_reduction(op), [x])
    assert widened.dtype == np.float16
    err = np.abs(widened.astype(np.float64) - ref).max() / np.abs(ref).max()
    assert err <= 2 ** -11, err
    stock = _run(_reduction(op), [x], widen=False, monkeypatch=monkeypatch)
    stock_err = np.abs(stock.astype(np.float64) - ref).max() / np.abs(ref).max()
    assert stock_err > 4 * err, (stock_err, err)


def test_float32_and_explicit_out_dtype_are_left_alone():
    for mod in (_matmul("float32"), _matmul("float16", out_dtype="float32")):
        assert tvm_ffi.structural_equal(AccumulateInFloat32()(mod), mod)
    widened = AccumulateInFloat32()(_matmul("bfloat16")).script()
    assert 'out_dtype="float32"' in widened and 'R.astype' in widened and 'dtype="bfloat16"' in widened


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_cuda_builds_compile(monkeypatch):
    from tvm_fusion_ext.compile.pipeline import compile_model
    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.tools.inspect_cuda import cuda_sources, kernel_report

    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")
    for mod in (_matmul(), _conv(), _reduction("softmax")):
        compiled = compile_model(mod, resolve_target("cuda:sm_90"), fuse_graph=False)
        rows = [r for s in cuda_sources(compiled.executable) for r in kernel_report(s, "sm_90")]
        assert rows and all(r["spill_bytes"] == 0 for r in rows), rows
        # the float32 accumulation and its casts: fused into the matmul's and convolution's one kernel
        names = [r["name"] for r in rows]
        assert any("cast" in n for n in names) and (len(rows) == 1 or "softmax" in names[0]), names
