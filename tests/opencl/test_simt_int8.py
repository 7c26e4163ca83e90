"""``precision="int8"`` in its CUDA form (compile/precision.py, ``for_cuda``) through the OpenCL stand-in: the row
quantisation's stock kernels, the SIMT int8 dense over the (N, K) weight (the form a GPU runs off the tensor-core
shapes, and for rows known only at run time) and, for the gated MLP, the gate product over the pair's side-by-side
output, every kernel on PoCL, against the numpy twins of the quantised computation. Tensor-core kernels cannot run
here (their lane layouts: tests/schedules/test_int8_fragments.py); bf16 cannot either (OpenCL C has no bf16 type)."""

import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_fusion_ext.compile.pipeline import prepare
from tvm_fusion_ext.compile.precision import LowerPrecision
from tvm_fusion_ext.compile.schedule import schedule
from tvm_fusion_ext.testing import fused_calls, quantize_rows_reference
from tvm_fusion_ext.tools.simt_on_cpu import OpenCLFunction, emulate_relax

TESTS = Path(__file__).resolve().parents[1]
SEQ = tvm.tirx.Var("seq", "int64")
#: stock kernels the CUDA form quantises rows with: min, max, their clamps to 0, scale, zero point, the cast
QUANTISE_KERNELS = 4


def _helpers():
    if str(TESTS / "compile") not in sys.path:
        sys.path.insert(0, str(TESTS / "compile"))


def _emulated(mod, simt):
    lowered, _ = prepare(LowerPrecision("int8", for_cuda=True)(mod), simt, fuse_graph=False)
    executable, kernels = emulate_relax(schedule(lowered, simt), simt)
    return relax.VirtualMachine(executable, tvm.cpu()), kernels


@pytest.mark.parametrize("rows,K,N,run_rows", [
    ((13,), 37, 40, (13,)),        # nothing a multiple of a tile; 13 × 37 uint8 activations (odd bytes)
    ((2, 16), 64, 48, (2, 16)),    # a tensor-core shape on a GPU: the SIMT dense here
    ((SEQ,), 45, 33, (3,)),        # rows known at run time: the fallback schedule's int8 dense
])
@pytest.mark.parametrize("act,bias", [("silu", True), ("gelu", False)])
def test_int8_gated_pair_matches_its_numpy_twin(simt, rows, K, N, run_rows, act, bias):
    _helpers()
    from test_precision_gated import _gated_module, _twin

    mod, wg, wu, b = _gated_module(rows, K, N, act, bias=bias)
    vm, kernels = _emulated(mod, simt)
    assert "gate_product" in kernels and any(name.startswith("fused_dense_int8") for name in kernels), list(kernels)
    assert len(kernels) > QUANTISE_KERNELS  # everything ran on PoCL, the quantisation too
    x = (np.random.default_rng(2).standard_normal((*run_rows, K)) + 0.3).astype("float32")
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    assert got.shape == (*run_rows, N)
    np.testing.assert_allclose(got, _twin(x, wg, wu, b, act), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows,K,N,act", [((13,), 37, 40, "gelu"), ((1, 20), 48, 64, "none")])
def test_int8_dense_matches_its_numpy_twin(simt, rows, K, N, act):
    """The plain int8 dense in the same form (the QKV, output and down projections of a model)."""
    _helpers()

    from tvm_fusion_ext.ops.dense_int8 import quantize_weight
    from tvm_fusion_ext.ops.registry import call_op
    from tvm_fusion_ext.testing import numpy_activation

    rng = np.random.default_rng(1)
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype("float32")
    b = rng.standard_normal(N).astype("float32")
    bb = relax.BlockBuilder()
    x_var = relax.Var("x", relax.TensorType((*rows, K), "float32"))
    with bb.function("main", [x_var]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(call_op(bb, "fused_dense", {"x": x_var, "w": relax.const(w),
                                                                     "bias": relax.const(b)}, {"act": act})))
        bb.emit_func_output(out)
    assert fused_calls(LowerPrecision("int8", for_cuda=True)(bb.get())) == {"fused_dense_int8": 1}
    vm, _ = _emulated(bb.get(), simt)
    x = rng.standard_normal((*rows, K)).astype("float32")
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    wq, w_scale, _ = quantize_weight(w)
    xq, x_scale, x_zero = quantize_rows_reference(x)
    want = numpy_activation(((xq - x_zero) @ wq.astype(np.float64)) * x_scale * w_scale + b, act)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_guards_are_byte_exact_for_odd_sized_buffers(simt):
    """A uint8 buffer of 13 bytes: writing all 13 is in bounds, writing a 14th is reported (the guard zone used to
    start at the last whole word, so the 13th byte read as a write past the end, and a 14th went unseen)."""
    from tvm.script import tirx as T

    def kernel(extent):
        @T.prim_func(s_tir=True)
        def main(A: T.Buffer((13,), "uint8"), B: T.Buffer((13,), "uint8")):  # noqa: F821  (TVMScript)
            for tx in T.thread_binding(extent, thread="threadIdx.x"):
                with T.sblock("B"):
                    i = T.axis.spatial(extent, tx)
                    B[i] = A[T.min(i, 12)] + T.uint8(1)

        return OpenCLFunction(tvm.IRModule({"main": main}), simt)

    out = np.zeros(13, "uint8")
    kernel(13)(np.arange(13, dtype="uint8"), out)
    np.testing.assert_array_equal(out, np.arange(1, 14))
    with pytest.raises(AssertionError, match="after the bounds of buffer 'B'"):
        kernel(14)(np.arange(13, dtype="uint8"), np.zeros(13, "uint8"))
