"""Symbolic CUDA attention gets the one-row (decode) branch that CPU attention has (compile/variants/decode.py): the
whole module scheduled for the CUDA family, its kernels run on PoCL through the OpenCL stand-in, at one query row
(the split-K decode kernels: splits, then the combine) and at several rows (the flash-loop kernels), with padded
pasts from the mask, against numpy; and a static one-row attention built for CUDA takes the decode form."""

import sys
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from tvm_fusion_ext.compile.pipeline import prepare
from tvm_fusion_ext.compile.schedule import schedule
from tvm_fusion_ext.compile.variants.decode import DECODE_ATTR
from tvm_fusion_ext.ops.registry import params_of
from tvm_fusion_ext.schedules.cuda.decode_attention import CUDA_DECODE_KEY_BLOCK, CUDA_DECODE_SPLIT_BLOCKS
from tvm_fusion_ext.testing import kernel_named
from tvm_fusion_ext.tools.simt_on_cpu import emulate_relax

TESTS = Path(__file__).resolve().parents[1]


def _dispatch_helpers():
    if str(TESTS / "compile") not in sys.path:
        sys.path.insert(0, str(TESTS / "compile"))
    import test_decode_dispatch

    return test_decode_dispatch


def test_symbolic_cuda_attention_runs_one_row_requests_with_the_decode_kernels(simt):
    helpers = _dispatch_helpers()
    lowered, _ = prepare(helpers._module({"scale": 0.125, "causal": True}), simt, fuse_graph=False)
    scheduled = schedule(lowered, simt)
    kernel = kernel_named(scheduled, "fused_attention")
    assert kernel.attrs[DECODE_ATTR] == "1"
    executable, kernels = emulate_relax(scheduled, simt)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    for batch, rows, past, pad in ((2, 1, 0, None), (2, 1, 1, None), (1, 1, 7, None), (3, 1, 129, (0, 40, 129)),
                                   (1, 1, 1000, None), (2, 5, 20, None)):
        q, k, v, mask = helpers._inputs(batch, rows, past, seed=past + rows, pad=pad)
        got = vm["main"](*[tvm.runtime.tensor(a) for a in (q, k, v, mask)]).numpy()
        want = helpers._reference(q, k, v, mask, 0.125)
        np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-5, err_msg=f"rows {rows}, past {past}")
        launched = [launch["kernel"] for fn in kernels.values() for launch in fn.launches]
        assert len(launched) == (2 if rows == 1 else len(launched)), launched  # splits + combine


def test_static_one_row_cuda_attention_takes_the_decode_form(simt):
    helpers = _dispatch_helpers()
    lowered, _ = prepare(helpers._module({"scale": 0.125}, rows=1, keys=300), simt, fuse_graph=False)
    params = params_of(kernel_named(lowered, "fused_attention"))
    assert params["split_blocks"] == CUDA_DECODE_SPLIT_BLOCKS and params["key_block"] == CUDA_DECODE_KEY_BLOCK
    executable, _ = emulate_relax(schedule(lowered, simt), simt)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    q, k, v, mask = helpers._inputs(2, 1, 299, seed=3, pad=(0, 100))
    got = vm["main"](*[tvm.runtime.tensor(a) for a in (q, k, v, mask)]).numpy()
    np.testing.assert_allclose(got, helpers._reference(q, k, v, mask, 0.125), rtol=3e-5, atol=3e-5)
