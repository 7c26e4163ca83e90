"""ResolveShapeComputations and the importer's symbolic Range/Expand: lengths computed from input sizes become
the input dims they equal, uniform masks become constants, and the model still computes the same thing."""

from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.transform import ResolveShapeComputations


def _exporter_idioms_model():
    """What dynamic-axis exports do with sizes: Shape → Squeeze → Range for positions, a position mask that is
    all true (positions >= 0) and-ed with the padding mask, an Expand to a shape computed at run time, and a
    Reshape with -1."""
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["len1"], start=1, end=2),
        helper.make_node("Squeeze", ["len1"], ["seq"]),
        helper.make_node("Range", ["zero", "seq", "one"], ["pos"]),
        helper.make_node("GreaterOrEqual", ["pos", "zero"], ["valid"]),           # all true: a uniform mask
        helper.make_node("Cast", ["mask"], ["mask_b"], to=TP.BOOL),
        helper.make_node("And", ["mask_b", "valid"], ["keep"]),                   # [batch, seq]
        helper.make_node("Cast", ["keep"], ["keep_f"], to=TP.FLOAT),
        helper.make_node("Unsqueeze", ["keep_f", "axes2"], ["keep3"]),           # [batch, seq, 1]
        helper.make_node("Shape", ["x"], ["xshape"]),
        helper.make_node("Expand", ["keep3", "xshape"], ["keep_x"]),              # [batch, seq, 8]
        helper.make_node("Mul", ["x", "keep_x"], ["masked"]),
        helper.make_node("Concat", ["len0", "len1", "minus1"], ["target"], axis=0),
        helper.make_node("Shape", ["x"], ["len0"], start=0, end=1),
        helper.make_node("Reshape", ["masked", "target"], ["y"]),
    ]
    nodes = [n for n in nodes if n.output[0] != "len0"]
    nodes.insert(0, helper.make_node("Shape", ["x"], ["len0"], start=0, end=1))
    graph = helper.make_graph(
        nodes, "idioms",
        [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", "seq", 8]),
         helper.make_tensor_value_info("mask", TP.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TP.FLOAT, ["batch", "seq", 8])],
        initializer=[i64("zero", 0), i64("one", 1), i64("axes2", [2]), i64("minus1", [-1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_lengths_are_the_input_dims_and_uniform_masks_fold(run_ort):
    from tvm_fusion_ext.runtime import CompiledModel

    model = _exporter_idioms_model()
    mod = load_onnx(model)
    text = mod.script(show_meta=False)
    # the importer's Range gives an arange over the input dim itself, not a data-dependent length
    assert "R.arange(0, seq, 1" in text and "range_len" not in text
    resolved = ResolveShapeComputations()(mod)
    folded = resolved.script(show_meta=False)
    assert re.search(r"broadcast_to\(R.const\(True, \"bool\"\)", folded), "the all-true position mask is a constant"
    assert "greater_equal" not in folded
    model_run = CompiledModel.from_module(mod, fuse=False)
    rng = np.random.default_rng(0)
    for batch, seq in ((1, 3), (2, 9)):
        x = rng.standard_normal((batch, seq, 8)).astype(np.float32)
        mask = (rng.random((batch, seq)) < 0.7).astype(np.int64)
        feeds = {"x": x, "mask": mask}
        np.testing.assert_allclose(model_run.run(feeds)["y"], run_ort(model, feeds)[0], rtol=1e-6, atol=1e-6)


def test_static_models_keep_their_meaning():
    """On a static export the pass only folds sizes that are constants already (the vocabulary size read from
    the embedding table's shape, used to wrap negative token ids)."""
    from tvm_fusion_ext.models import build_encoder_onnx, sample_inputs
    from tvm_fusion_ext.testing import run_relax

    model = build_encoder_onnx(num_layers=1, hidden=32, heads=2, intermediate=64, seq=8)
    mod = load_onnx(model)
    resolved = ResolveShapeComputations()(mod)
    assert "shape_of" not in resolved.script(show_meta=False)
    feeds = sample_inputs(model, seed=1)
    inputs = [feeds[n] for n in ("input_ids", "attention_mask")]
    np.testing.assert_allclose(run_relax(resolved, inputs), run_relax(mod, inputs), rtol=1e-6, atol=1e-6)
    assert ResolveShapeComputations()(resolved).same_as(resolved)  # nothing left to do: the same module back


def test_a_length_that_is_not_a_size_stays_data_dependent():
    """A Range whose limit is a value read from a tensor (not a size) has no compile-time length: the importer
    keeps TVM's data-dependent form, and the pass binds nothing it cannot prove."""
    nodes = [helper.make_node("ReduceMax", ["n"], ["limit"], keepdims=0),
             helper.make_node("Range", ["zero", "limit", "one"], ["y"])]
    graph = helper.make_graph(nodes, "r", [helper.make_tensor_value_info("n", TP.INT64, [3])],
                              [helper.make_tensor_value_info("y", TP.INT64, ["k"])],
                              initializer=[numpy_helper.from_array(np.array(0, np.int64), "zero"),
                                           numpy_helper.from_array(np.array(1, np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    mod = load_onnx(model)
    assert "range_len" in mod.script(show_meta=False)
    resolved = ResolveShapeComputations()(mod)
    assert "range_len" in resolved.script(show_meta=False)
