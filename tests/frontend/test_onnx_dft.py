"""ONNX ``DFT`` written as two real matrix products (``frontend/converters/signal.py``): forward and inverse, real and
complex input, one-sided, any axis, a static and a symbolic length, against ``numpy.fft``; the refusals in one line."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tvm_fusion_ext.errors import ModelLoadError
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.runtime import CompiledModel


def _dft_model(shape, axis=1, inverse=0, onesided=0, length=None):
    inputs = ["x"] + (["len"] if length is not None else [])
    inits = [numpy_helper.from_array(np.asarray(length, np.int64), "len")] if length is not None else []
    node = helper.make_node("DFT", inputs, ["y"], name="fourier", axis=axis, inverse=inverse, onesided=onesided)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TP.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _complex(y):
    return y[..., 0] + 1j * y[..., 1]


def _run(m, x):
    return CompiledModel.from_module(load_onnx(m), fuse=False).run({"x": x})["y"]


@pytest.mark.parametrize("axis", [1, 2])
def test_forward_dft_of_a_real_signal(axis):
    x = np.random.default_rng(axis).standard_normal((2, 12, 10, 1)).astype(np.float32)
    got = _complex(_run(_dft_model([2, 12, 10, 1], axis=axis), x))
    np.testing.assert_allclose(got, np.fft.fft(x[..., 0], axis=axis), rtol=1e-4, atol=1e-4)


def test_inverse_dft_of_a_complex_signal():
    z = np.random.default_rng(0).standard_normal((3, 16, 2)).astype(np.float32)
    got = _complex(_run(_dft_model([3, 16, 2], axis=1, inverse=1), z))
    np.testing.assert_allclose(got, np.fft.ifft(_complex(z), axis=1), rtol=1e-5, atol=1e-5)


def test_onesided_dft_of_a_real_signal_and_a_given_length():
    x = np.random.default_rng(1).standard_normal((2, 9, 1)).astype(np.float32)
    got = _complex(_run(_dft_model([2, 9, 1], axis=1, onesided=1, length=9), x))
    assert got.shape == (2, 5)
    np.testing.assert_allclose(got, np.fft.rfft(x[..., 0], axis=1), rtol=1e-4, atol=1e-4)


def test_a_symbolic_length_computes_its_twiddles_at_run_time():
    model = CompiledModel.from_module(load_onnx(_dft_model(["batch", "seq", 2], axis=1)), fuse=False)
    for seq in (1, 7, 20):
        z = np.random.default_rng(seq).standard_normal((2, seq, 2)).astype(np.float32)
        np.testing.assert_allclose(_complex(model.run({"x": z})["y"]), np.fft.fft(_complex(z), axis=1),
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kw, reason", [
    (dict(length=12), r"dft_length 12 differs from the axis length 9"),
    (dict(axis=2), r"axis 2 is not a signal axis of a rank-3 input"),
    (dict(inverse=1, onesided=1), r"a one-sided inverse DFT \(irfft\) is not implemented"),
])
def test_refusals_name_the_node_and_the_reason(kw, reason):
    with pytest.raises(ModelLoadError, match=r"op 'DFT' \(node 'fourier'\) is not supported: " + reason):
        load_onnx(_dft_model([2, 9, 2], **kw))
