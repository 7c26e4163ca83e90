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
