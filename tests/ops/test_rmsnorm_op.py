"""fused_rmsnorm: compute + CPU template against a float64 numpy RMSNorm; the CUDA template compiles."""

import shutil

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir

from tvm_fusion_ext.ops.registry import make_prim_func
from tvm_fusion_ext.schedules.cpu.rmsnorm import RMSNormCPU
from tvm_fusion_ext.schedules.registry import get_template
from tvm_fusion_ext.targets import resolve_target

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def _func(inputs, params):
    ty = lambda a: relax.TensorType(list(a.shape), str(a.dtype))  # noqa: E731
    return make_prim_func("fused_rmsnorm", {k: ty(v) for k, v in inputs.items()}, params).with_attr(
        "global_symbol", "main")


def _run(shape, with_inputs, dtype="float32", out_dtype=None, eps=1e-6, seed=0):
    rng = np.random.default_rng(seed)
    inputs = {"x": rng.standard_normal(shape).astype(dtype)}
    if "residual" in with_inputs:
        inputs["residual"] = rng.standard_normal(shape).astype(dtype)
    if "gamma" in with_inputs:
        inputs["gamma"] = rng.standard_normal(shape[-1]).astype(dtype)
    params = {"eps": eps}
    if out_dtype:
        params["out_dtype"] = out_dtype
    sch = s_tir.Schedule(tvm.IRModule({"main": _func(inputs, params)}), seed=1)
    get_template("tfx.rmsnorm", TARGET)(sch, sch.get_sblock("rms_input"), TARGET)
    lib = tvm.compile(sch.mod, target=TARGET)
    out = tvm.runtime.empty(shape, out_dtype or dtype)
    lib(*[tvm.runtime.tensor(v) for v in inputs.values()], out)
    h = inputs["x"].astype("float64") + inputs.get("residual", np.float64(0)).astype("float64")
    ref = h / np.sqrt((h * h).mean(-1, keepdims=True) + eps) * inputs.get("gamma", np.float64(1)).astype("float64")
    return out.numpy(), ref, sch.mod["main"].script()


@pytest.mark.parametrize("with_inputs", [(), ("gamma",), ("residual", "gamma"), ("residual",)])
@pytest.mark.parametrize("shape", [(4, 64), (1, 7, 1024), (3, 13)])
def test_optional_inputs_and_odd_rows(shape, with_inputs):
    got, want, _ = _run(shape, with_inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_float16_in_fp32_statistics_out():
    got, want, _ = _run((5, 256), ("residual", "gamma"), dtype="float16")
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype("float32"), want, rtol=2e-3, atol=2e-3)
    got32, _, _ = _run((5, 256), ("gamma",), dtype="float16", out_dtype="float32")
    assert got32.dtype == np.float32


def test_schedule_is_row_parallel_and_vectorised():
    _, _, script = _run((16, 1024), ("gamma",))
    assert script.count("T.parallel(") == 1
    assert "rms_sumsq_rf" in script and script.count("T.vectorized(") >= 3


def test_registered_as_cpu_template():
    assert isinstance(get_template("tfx.rmsnorm", TARGET), RMSNormCPU)


@pytest.mark.parametrize("shape,gamma,message", [((4, 8), (9,), "not a vector of width 8"),
                                                 ((4, 8), (1, 8), "not a vector of width 8")])
def test_rejects_bad_gamma(shape, gamma, message):
    with pytest.raises(ValueError, match=message):
        _func({"x": np.zeros(shape, "float32"), "gamma": np.zeros(gamma, "float32")}, {"eps": 1e-6})


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("N,dtype,arch", [(1024, "float32", "sm_90"), (896, "float16", "sm_80")])
def test_cuda_template_compiles(N, dtype, arch, monkeypatch):
    from tvm_fusion_ext.tools.inspect_cuda import cuda_sources, kernel_report

    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")
    inputs = {"x": np.zeros((1, 64, N), dtype), "residual": np.zeros((1, 64, N), dtype),
              "gamma": np.zeros((N,), dtype)}
    target = resolve_target(f"cuda:{arch}")
    sch = s_tir.Schedule(tvm.IRModule({"main": _func(inputs, {"eps": 1e-6})}), seed=1)
    get_template("tfx.rmsnorm", target)(sch, sch.get_sblock("rms_input"), target)
    (src,) = cuda_sources(tvm.compile(sch.mod, target))
    (row,) = kernel_report(src, arch)
    assert row["spill_bytes"] == 0 and row["stack_bytes"] == 0, row
    assert "__shfl" in src  # the sum of squares is a warp-shuffle reduction
