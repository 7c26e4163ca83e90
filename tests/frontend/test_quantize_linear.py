"""QuantizeLinear as ONNX Runtime computes it, NaN included (``frontend/converters/quantization.py``).

``onnxruntime.quantization.quantize_static`` calibrates BERT's additive attention mask (0 or ``finfo.min``) to
scale = inf, so the model quantizes ``-inf / inf`` = NaN: ONNX Runtime gives the lowest integer (masked), TVM's
stock lowering gave the highest (``+inf`` after dequantizing: the masked keys weighted most). Checked per
element against ONNX Runtime, and on a statically quantized (QDQ) MiniLM, fused, against ONNX Runtime with its
optimizations off (the QDQ graph as written)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.runtime import CompiledModel

SPECIAL = [0.0, -3.4028235e38, -np.inf, np.inf, 3.4e38, -1e9, 1e9, -5.0, 2.5, -2.5, 0.49, np.nan]


def _quantize_model(shape, scale, zero_point, axis=None, opset=17):
    inputs = ["x", "scale"] + (["zp"] if zero_point is not None else [])
    attrs = {} if axis is None else {"axis": axis}
    inits = [numpy_helper.from_array(np.asarray(scale, np.float32), "scale")]
    if zero_point is not None:
        inits.append(numpy_helper.from_array(np.asarray(zero_point), "zp"))
    out_type = TP.UINT8 if zero_point is None or np.asarray(zero_point).dtype == np.uint8 else TP.INT8
    graph = helper.make_graph([helper.make_node("QuantizeLinear", inputs, ["y"], **attrs)], "q",
                              [helper.make_tensor_value_info("x", TP.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", out_type, list(shape))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("scale,zero_point", [
    (np.inf, np.int8(0)),          # quantize_static's mask scale: every value / inf
    (0.5, np.int8(3)),
    (0.01, np.uint8(128)),
    (0.25, None),                   # no zero point: uint8
])
def test_special_values_quantize_as_onnx_runtime_does(run_ort, scale, zero_point):
    x = np.asarray(SPECIAL, np.float32)
    m = _quantize_model(x.shape, scale, zero_point)
    got = CompiledModel.from_module(load_onnx(m), fuse=False).run({"x": x})["y"]
    np.testing.assert_array_equal(got, run_ort(m, {"x": x})[0])


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_per_axis_scales(run_ort, axis):
    x = np.random.default_rng(axis + 5).standard_normal((3, 4)).astype(np.float32) * 40
    x[1, 2] = np.nan
    n = x.shape[axis]
    scale = np.linspace(0.1, 0.9, n).astype(np.float32)
    zp = np.arange(n, dtype=np.int8) - 2
    m = _quantize_model(x.shape, scale, zp, axis=axis, opset=13)
    got = CompiledModel.from_module(load_onnx(m), fuse=False).run({"x": x})["y"]
    np.testing.assert_array_equal(got, run_ort(m, {"x": x})[0])


@pytest.mark.slow
def test_statically_quantized_minilm_matches_onnx_runtime(export_dir):
    ort = pytest.importorskip("onnxruntime")
    quantization = pytest.importorskip("onnxruntime.quantization")
    from tvm_fusion_ext.compile import fuse
    from tvm_fusion_ext.models import export_hf_model

    src = export_hf_model("minilm", export_dir / "minilm_l2_s16.onnx", seq=16, num_layers=2)

    def feeds(seed):
        r = np.random.default_rng(seed)
        mask = np.ones((1, 16), np.int64)
        mask[0, 12:] = 0
        return {"input_ids": r.integers(3, 1000, (1, 16)).astype(np.int64), "attention_mask": mask,
                "token_type_ids": np.zeros((1, 16), np.int64)}

    class Calibration(quantization.CalibrationDataReader):
        def __init__(self):
            self.batches = iter([feeds(i) for i in range(4)])

        def get_next(self):
            return next(self.batches, None)

    qdq = str(export_dir / "minilm_l2_s16_qdq.onnx")
    quantization.quantize_static(src, qdq, Calibration(), quant_format=quantization.QuantFormat.QDQ,
                                 activation_type=quantization.QuantType.QInt8,
                                 weight_type=quantization.QuantType.QInt8)
    f = feeds(9)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(qdq, options).run(None, f)[0]
    mod = load_onnx(qdq)
    _, report = fuse(mod)
    assert report.fused["dense"] >= 8 and report.fused["layernorm"] >= 4, report.summary()
    got = CompiledModel.from_module(mod).run(f)
    got = got[next(iter(got))]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
