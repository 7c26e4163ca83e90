"""The split-K decode attention through its CUDA template on a real GPU (skipped without one): the campaign's
decode cases (P = 0 … 1000, MHA / GQA / MQA, head dims 64 / 128, fp32 / fp16, padded pasts) against numpy, and a
symbolic attention whose one-row requests take the decode kernels through the VM. PoCL runs the same on the CPU
(tests/opencl/test_simt_decode_*.py); nvcc compiles them everywhere (tests/cuda/test_cuda_decode_attention.py)."""

import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir

from tvm_fusion_ext.compile.pipeline import compile_model
from tvm_fusion_ext.ops.registry import make_prim_func
from tvm_fusion_ext.schedules.registry import get_template
from tvm_fusion_ext.tools.gpu_campaign.numerics import decode_attention_cases

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compile"))
import test_decode_dispatch as dispatch  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", decode_attention_cases(), ids=lambda c: c[0])
def test_decode_attention_on_gpu(gpu, case):
    dev, target = gpu
    name, op, rule, inputs, params, out_shape, out_dtype, want, tol, _ = case
    func = make_prim_func(op, {k: relax.TensorType(list(a.shape), d) for k, (a, d) in inputs.items()}, params)
    sch = s_tir.Schedule(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), seed=1)
    get_template(rule, target)(sch, sch.get_sblock("dec_out"), target)
    with target:
        lib = tvm.compile(sch.mod, target)
    out = tvm.runtime.empty(out_shape, out_dtype, dev)
    lib(*[tvm.runtime.tensor(a.astype(d), dev) for a, d in inputs.values()], out)
    np.testing.assert_allclose(out.numpy().astype("float64"), want, rtol=tol, atol=tol, err_msg=name)


def test_symbolic_attention_one_row_branch_on_gpu(gpu):
    dev, target = gpu
    compiled = compile_model(dispatch._module({"scale": 0.125, "causal": True}), target, fuse_graph=False)
    vm = relax.VirtualMachine(compiled.executable, dev)
    for batch, rows, past, pad in ((2, 1, 0, None), (1, 1, 7, None), (3, 1, 129, (0, 40, 129)), (1, 1, 1000, None),
                                   (2, 5, 20, None)):
        feeds = dispatch._inputs(batch, rows, past, seed=past + rows, pad=pad)
        got = vm["main"](*[tvm.runtime.tensor(a, dev) for a in feeds]).numpy()
        np.testing.assert_allclose(got, dispatch._reference(*feeds, 0.125), rtol=1e-4, atol=1e-4,
                                   err_msg=f"rows {rows}, past {past}")
