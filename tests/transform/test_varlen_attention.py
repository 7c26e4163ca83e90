"""RemovePadding's choice between the packed (varlen) attention and the scatter/gather around the padded one.

A mask that is the same for every query (the key-padding mask) runs packed; one with anything else in it (a
position bias, a causal triangle as a constant) keeps the scatter/gather, counted as a near miss of
``varlen_attention``. Either way the valid positions equal ONNX Runtime and our padded build. Packed attention on
right, left and holed padding is checked by test_remove_padding.py (its encoders all run packed)."""

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import relax

from tvm_fusion_ext.compile import compile_model
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.models import build_encoder_onnx
from tvm_fusion_ext.transform.padding_mask import key_axis_reason, key_only_reason

from test_remove_padding import B, S, _masks, _run


def _with_position_bias(model, bias):
    """The eager encoder with ``bias [1, 1, S, S]`` added to its additive padding mask (every layer reads it)."""
    g = model.graph
    g.initializer.append(numpy_helper.from_array(bias, "mask/position_bias"))
    at = next(n for n, node in enumerate(g.node) if node.name == "mask/Mul")
    old = g.node[at].output[0]
    for node in g.node:
        node.input[:] = ["mask/biased" if i == old else i for i in node.input]
    g.node.insert(at + 1, helper.make_node("Add", [old, "mask/position_bias"], ["mask/biased"], name="mask/Bias"))
    return model


def _compare(model, case):
    import onnxruntime as ort

    mod = load_onnx(model)
    free = compile_model(mod, "llvm", remove_padding=True)
    padded = compile_model(mod, "llvm", remove_padding=False)
    mask = _masks()[case]
    ids = np.random.default_rng(3).integers(0, 100, (B, S)).astype(np.int64)
    got, ours_padded = _run(free.executable, ids, mask), _run(padded.executable, ids, mask)
    ref = ort.InferenceSession(model.SerializeToString()).run(None, {"input_ids": ids, "attention_mask": mask})[0]
    valid = mask.astype(bool)
    np.testing.assert_allclose(got[valid], ref[valid], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[valid], ours_padded[valid], rtol=1e-5, atol=1e-5)
    assert np.all(got[~valid] == 0.0)
    return free


def _bias(kind):
    if kind == "position":  # <= 0 everywhere: the zeros of the mask still hide their keys
        return (-0.3 * np.abs(np.subtract.outer(np.arange(S), np.arange(S))).astype(np.float32))[None, None]
    return np.where(np.triu(np.ones((S, S), bool), 1), -1e4, 0).astype(np.float32)[None, None]  # causal


@pytest.mark.parametrize("kind,case", [("position", "mixed"), ("position", "holes"), ("causal", "left"),
                                       ("causal", "holes")])
def test_bias_beyond_the_keys_keeps_the_scatter_gather(kind, case):
    model = _with_position_bias(build_encoder_onnx(num_layers=1, batch=B, seq=S), _bias(kind))
    report = _compare(model, case).report
    assert report.padding_removed == 1 and report.varlen_attention == 0, report.summary()
    reasons = [e.detail for e in report.refused if e.kind == "varlen_attention"]
    assert len(reasons) == 1 and "non-uniform constant" in reasons[0] and "scatter/gather" in reasons[0]


@pytest.mark.slow  # 15 s: builds the packed kernel
def test_uniform_bias_still_runs_packed():
    """A constant the same for every (query, key) is part of g(m[b, j]): still key-only."""
    model = _with_position_bias(build_encoder_onnx(num_layers=1, batch=B, seq=S),
                                np.full((1, 1, S, S), -0.5, np.float32))
    report = _compare(model, "left").report
    assert report.varlen_attention == 1, report.summary()


def _mask_graph(layout):
    """main(m [B, S]) -> additive mask broadcast to [B, 1, S, S]: key-wise ([B,1,1,S]) or query-wise ([B,1,S,1])."""
    from tvm_fusion_ext.transform.graph import FunctionGraph

    m = relax.Var("m", relax.TensorType([B, S], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [m]):
        with bb.dataflow():
            shaped = bb.emit(relax.op.reshape(m, layout))
            add = bb.emit(relax.op.multiply(relax.op.subtract(relax.const(1.0), shaped), relax.const(-1e4)))
            out = bb.emit_output(relax.op.broadcast_to(add, [B, 1, S, S]))
        bb.emit_func_output(out)
    mod = bb.get()
    return FunctionGraph(mod["main"], mod), out, m


def test_key_only_reason_tells_key_from_query_masks():
    graph, mask, m = _mask_graph([B, 1, 1, S])
    assert key_only_reason(graph, mask, m) is None
    graph, mask, m = _mask_graph([B, 1, S, 1])
    assert "off the key axis" in key_only_reason(graph, mask, m)


def test_key_axis_reason_allows_query_varying_constants_but_not_query_masks():
    """Stage 1 (scatter/gather) needs m on the key axis only; a causal triangle constant is fine there."""
    graph, mask, m = _mask_graph([B, 1, 1, S])
    assert key_axis_reason(graph, mask, m) is None
    graph, mask, m = _mask_graph([B, 1, S, 1])
    assert "off the key axis" in key_axis_reason(graph, mask, m)
