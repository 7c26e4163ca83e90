"""``If`` nodes decided at import (``frontend/converters/control_flow.py``): the taken branch replaces the node, the
other is never imported. torch's legacy exporter writes ``x.repeat(...)`` as ``If(rank(x) - 1 > 0)`` around the repeats,
with an untaken branch that reshapes to a shape computed in a tensor, which TVM cannot import (DINOv3 failed there).
Checked against numpy and ONNX Runtime; conditions that need input data or a dynamic dim are left to TVM's import."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.frontend.converters.control_flow import fold_static_ifs
from tvm_fusion_ext.runtime import CompiledModel


def _int64(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _repeat_model(x_dims=(2, 3)):
    """DINOv3's rope tiling, as the legacy exporter writes ``t.repeat(2, 1)``: ``d = rank(x) - 2``; repeats are
    ``[1] * d + [2, 1]`` if ``d > 0``; the tile input is ``x`` reshaped to ``[1] * -d + shape(x)`` if ``d < 0``
    (a reshape to a shape computed in a tensor, which TVM cannot import as it is)."""
    then_a = helper.make_graph(
        [helper.make_node("Reshape", ["d", "one"], ["d1"], name="d1"),
         helper.make_node("Expand", ["one", "d1"], ["ones"], name="ones"),
         helper.make_node("Concat", ["ones", "reps0"], ["reps_a"], axis=0, name="reps_a")],
        "then_a", [], [helper.make_tensor_value_info("reps_a", TP.INT64, None)])
    else_a = helper.make_graph([helper.make_node("Identity", ["reps0"], ["reps_b"], name="reps_b")],
                               "else_a", [], [helper.make_tensor_value_info("reps_b", TP.INT64, None)])
    then_b = helper.make_graph(
        [helper.make_node("Abs", ["d"], ["nd"], name="nd"),
         helper.make_node("Reshape", ["nd", "one"], ["nd1"], name="nd1"),
         helper.make_node("Expand", ["one", "nd1"], ["lead"], name="lead"),
         helper.make_node("Concat", ["lead", "shape"], ["new_shape"], axis=0, name="new_shape"),
         helper.make_node("Reshape", ["x", "new_shape"], ["x_b"], name="x_b")],
        "then_b", [], [helper.make_tensor_value_info("x_b", TP.FLOAT, None)])
    else_b = helper.make_graph([helper.make_node("Identity", ["x"], ["x_c"], name="x_c")],
                               "else_b", [], [helper.make_tensor_value_info("x_c", TP.FLOAT, None)])
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Size", ["shape"], ["rank"], name="rank"),
             helper.make_node("Sub", ["rank", "one_s"], ["d"], name="d"),
             helper.make_node("Greater", ["d", "zero"], ["more"], name="more"),
             helper.make_node("If", ["more"], ["reps"], then_branch=then_a, else_branch=else_a, name="if_reps"),
             helper.make_node("Less", ["d", "zero"], ["fewer"], name="fewer"),
             helper.make_node("If", ["fewer"], ["x_t"], then_branch=then_b, else_branch=else_b, name="if_x"),
             helper.make_node("Tile", ["x_t", "reps"], ["y"], name="tile")]
    inits = [_int64("one", [1]), _int64("one_s", 2), _int64("zero", [0]), _int64("reps0", [2, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, list(x_dims))],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("x_dims, y_dims", [((2, 3), [4, 3]), ((5, 2, 3), [5, 4, 3]), ((3,), [2, 3])])
def test_rank_tests_fold_to_the_taken_branch_and_match_onnx_runtime(run_ort, x_dims, y_dims):
    m = _repeat_model(x_dims)
    before = m.SerializeToString()
    folded, n = fold_static_ifs(m)
    assert n == 2 and not any(node.op_type == "If" for node in folded.graph.node)
    assert m.SerializeToString() == before                       # the caller's model is not changed
    mod = load_onnx(m)
    assert [int(d) for d in mod["main"].ret_ty.shape.values] == y_dims  # repeats and reshape known at import
    x = np.random.default_rng(0).standard_normal(x_dims).astype(np.float32)
    got = CompiledModel.from_module(mod, fuse=False).run({"x": x})["y"]
    lead = max(0, 2 - x.ndim)
    np.testing.assert_array_equal(got, np.tile(x.reshape((1,) * lead + x.shape), (1,) * (x.ndim - 2 + lead) + (2, 1)))
    if x.ndim >= 2:  # ONNX Runtime checks the branch not taken too, and for a vector it expands to -1 entries
        np.testing.assert_array_equal(got, run_ort(m, {"x": x})[0])


def _data_condition_model(dims):
    """``y = x + 1 if sum(x) > 0 else x - 1``, and a second ``If`` on ``shape(x)[0] > 1``."""
    def branch(name, op):
        return helper.make_graph([helper.make_node(op, ["x", "one_f"], [f"{name}_out"], name=name)], name, [],
                                 [helper.make_tensor_value_info(f"{name}_out", TP.FLOAT, None)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0, name="total"),
             helper.make_node("Greater", ["total", "zero_f"], ["positive"], name="positive"),
             helper.make_node("If", ["positive"], ["y"], then_branch=branch("plus", "Add"),
                              else_branch=branch("minus", "Sub"), name="if_data"),
             helper.make_node("Shape", ["x"], ["shape"], start=0, end=1, name="shape"),
             helper.make_node("Greater", ["shape", "one"], ["many"], name="many"),
             helper.make_node("Squeeze", ["many"], ["many_s"], name="many_s"),
             helper.make_node("If", ["many_s"], ["z"], then_branch=branch("plus2", "Add"),
                              else_branch=branch("minus2", "Sub"), name="if_dim")]
    inits = [numpy_helper.from_array(np.asarray(1, np.float32), "one_f"),
             numpy_helper.from_array(np.asarray(0, np.float32), "zero_f"), _int64("one", [1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None),
                               helper.make_tensor_value_info("z", TP.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("dims, folded", [(["batch", 4], 0), ([3, 4], 1)])
def test_conditions_on_data_or_a_dynamic_dim_stay(dims, folded):
    """A condition on input data is never folded; one on a dim only where the dim is static."""
    m = _data_condition_model(dims)
    out, n = fold_static_ifs(m)
    assert n == folded
    kept = [node.name for node in out.graph.node if node.op_type == "If"]
    assert kept == (["if_data", "if_dim"] if folded == 0 else ["if_data"])


def _if_layernorm_model():
    """A merged decoder's shape in small: ``If(c)`` whose branches each normalise ``x`` (LayerNormalization, one
    output asked for of its three) and apply Relu; the then branch squares the result too."""
    w = numpy_helper.from_array(np.linspace(0.5, 1.5, 4).astype(np.float32), "w")
    b = numpy_helper.from_array(np.linspace(-0.1, 0.1, 4).astype(np.float32), "b")

    def branch(name, square):
        nodes = [helper.make_node("LayerNormalization", ["x", "w", "b"], [f"{name}_ln"], axis=-1, epsilon=1e-5),
                 helper.make_node("Relu", [f"{name}_ln"], [f"{name}_relu"])]
        nodes.append(helper.make_node("Mul" if square else "Identity",
                                      [f"{name}_relu", f"{name}_relu"] if square else [f"{name}_relu"],
                                      [f"{name}_out"]))
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_out", TP.FLOAT, ["n", 4])])

    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch("then", True), else_branch=branch("else", False))],
        "if_layernorm", [helper.make_tensor_value_info("c", TP.BOOL, [1]),
                         helper.make_tensor_value_info("x", TP.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TP.FLOAT, ["n", 4])], initializer=[w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    import onnx

    onnx.checker.check_model(model)
    return model


def test_branches_of_a_runtime_if_import_and_fuse_like_a_top_level_graph(run_ort):
    """Before: the branch's LayerNormalization reached Relu as a 3-tuple ("relax.nn.relu requires argument 0 (x)
    to be a tensor"), and nothing fused in a graph holding an If (no dataflow block for the rules to match in)."""
    from tvm_fusion_ext.compile import fuse

    model = _if_layernorm_model()
    mod = load_onnx(model)
    _, report = fuse(mod)
    assert report.fused["layernorm"] == 2, report.summary()
    compiled = CompiledModel.from_module(mod)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    for c in (True, False):
        feeds = {"c": np.array([c]), "x": x}
        np.testing.assert_allclose(compiled.run(feeds)["y"], run_ort(model, feeds)[0], rtol=1e-5, atol=1e-5)
