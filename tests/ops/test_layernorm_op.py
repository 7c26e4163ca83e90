"""fused_layernorm on CPU: compute + template, against a float64 numpy LayerNorm."""

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir

from tvm_fusion_ext.ops.registry import make_prim_func
from tvm_fusion_ext.schedules.cpu.layernorm import LayerNormCPU, layernorm_cpu
from tvm_fusion_ext.schedules.registry import get_template

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def _run(shape, with_inputs, eps=1e-5, offset=0.0, knobs=None, seed=0):
    rng = np.random.default_rng(seed)
    n = shape[-1]
    x = (rng.standard_normal(shape) + offset).astype("float32")
    inputs = {"x": x}
    if "residual" in with_inputs:
        inputs["residual"] = rng.standard_normal(shape).astype("float32")
    for name in ("bias", "gamma", "beta"):
        if name in with_inputs:
            inputs[name] = rng.standard_normal(n).astype("float32")
    ty = lambda a: relax.TensorType(list(a.shape), "float32")  # noqa: E731
    func = make_prim_func("fused_layernorm", {k: ty(v) for k, v in inputs.items()}, {"eps": eps})
    sch = s_tir.Schedule(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), seed=1)
    layernorm_cpu(sch, sch.get_sblock("ln_input"), TARGET, knobs)
    lib = tvm.compile(sch.mod, target=TARGET)
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros(shape, "float32"), dev)
    lib(*[tvm.runtime.tensor(v, dev) for v in inputs.values()], out)

    h = x.astype("float64") + inputs.get("residual", 0) + inputs.get("bias", 0)
    mu = h.mean(-1, keepdims=True)
    ref = (h - mu) / np.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + eps)
    ref = ref * inputs.get("gamma", 1) + inputs.get("beta", 0)
    return out.numpy(), ref, sch.mod["main"].script()


@pytest.mark.parametrize("with_inputs", [(), ("residual",), ("residual", "bias"), ("gamma", "beta"),
                                         ("residual", "bias", "gamma", "beta"), ("bias", "beta")])
@pytest.mark.parametrize("shape", [(4, 384), (1, 16, 64), (3, 13), (2, 5, 100), (7,)])
def test_optional_inputs_and_odd_rows(shape, with_inputs):
    got, want, _ = _run(shape, with_inputs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(8, 384), (5, 13)])
def test_rows_with_large_mean(shape):
    # Two-pass statistics: a mean of 1e4 must not swamp a unit variance (E[x^2]-E[x]^2 in fp32 loses every
    # digit here). What remains is the fp32 rounding of the row sum (ulp(3.8e6) = 0.25) feeding the mean.
    got, want, _ = _run(shape, ("residual", "gamma", "beta"), offset=1e4)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("unroll", [0, 2])
def test_explicit_knobs(unroll):
    got, want, _ = _run((16, 64), ("residual", "gamma", "beta"), knobs={"unroll": unroll})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_schedule_is_row_parallel_and_vectorised():
    _, _, script = _run((32, 384), ("residual", "gamma", "beta"))
    assert script.count("T.parallel(") == 1
    # row input, two rfactored reductions and the output are vectorised
    assert script.count("T.vectorized(") >= 4
    assert "ln_sum_rf" in script and "ln_sqdev_rf" in script


def test_registered_as_cpu_template():
    assert isinstance(get_template("tfx.layernorm", TARGET), LayerNormCPU)
