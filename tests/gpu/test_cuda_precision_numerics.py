"""``precision="int8"`` / ``"bf16"`` on a real GPU (skipped without one): the int8 dense against numpy's exact
integer arithmetic (the GPU campaign's cases), and a whole encoder in each precision against its CPU build."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_fusion_ext.tools.gpu_campaign.numerics import int8_dense_cases

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", int8_dense_cases(), ids=lambda c: c[0])
def test_int8_dense_matches_exact_integer_reference(gpu, case):
    from test_cuda_numerics import _run

    _, op, rule, inputs, params, out_shape, out_dtype, want, tol, _ = case
    got = _run(op, rule, inputs, params, out_shape, out_dtype, gpu)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("precision,tol", [("int8", 1e-2), ("bf16", 1e-2)])
def test_low_precision_encoder_matches_its_cpu_build(gpu, precision, tol):
    from tvm_fusion_ext.compile import compile_model
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.models import default_model_path
    from tvm_fusion_ext.testing import random_inputs

    dev, target = gpu
    mod = load_onnx(default_model_path())
    inputs = random_inputs(mod, seed=0)
    outs = []
    for tgt, d in ((target, dev), ("llvm", tvm.cpu())):
        vm = relax.VirtualMachine(compile_model(mod, tgt, precision=precision).executable, d)
        outs.append(vm["main"](*[tvm.runtime.tensor(a, d) for a in inputs]).numpy())
    # the same rounding or quantisation; fp32 sums in another order, and (int8) a value on a rounding boundary of
    # x / scale may land one step apart
    np.testing.assert_allclose(outs[0], outs[1], rtol=tol, atol=tol)


@pytest.mark.parametrize("precision,tol", [("int8", 5e-3), ("bf16", 1e-3)])
@pytest.mark.parametrize("rows,K,N,act,run_rows", [
    ((32,), 256, 352, "silu", (32,)),  # the tensor-core dense over the side-by-side columns
    ((13,), 37, 40, "gelu", (13,)),    # the SIMT dense
])
def test_gated_pair_matches_its_numpy_twin(gpu, precision, tol, rows, K, N, act, run_rows):
    """The gated MLP's pair as the compile path builds it (one dense over the gate's and up projection's columns side
    by side, then the gate product) against numpy: the quantised computation for int8 (a value on a rounding
    boundary of ``x / scale`` may land one step apart), the bf16-rounded one for bf16."""
    import sys
    from pathlib import Path

    import ml_dtypes

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compile"))
    from test_precision_gated import _fp32, _gated_module, _twin

    from tvm_fusion_ext.compile import compile_model

    dev, target = gpu
    mod, wg, wu, b = _gated_module(rows, K, N, act)
    vm = relax.VirtualMachine(compile_model(mod, target, fuse_graph=False, precision=precision).executable, dev)
    x = (np.random.default_rng(2).standard_normal((*run_rows, K)) + 0.3).astype("float32")
    got = vm["main"](tvm.runtime.tensor(x, dev)).numpy()
    r = lambda a: a.astype(ml_dtypes.bfloat16).astype(np.float64)  # noqa: E731
    want = _twin(x, wg, wu, b, act) if precision == "int8" else _fp32(r(x), r(wg), r(wu), b, act)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
