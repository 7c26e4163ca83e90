"""Gather/scatter indices (``compile/checks/gather_indices.py``): negative ones counted from the end as ONNX means them,
and any outside the data refused at run time in one line, where TVM's kernels read (or write) past the buffer.
References: ONNX Runtime on the same file and numpy. The computed case is the dynamo KV-cache export's mask
gather, small: positions from ``Range(0, len(x))`` read from ``data``, with ``data`` shorter than ``x``."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tvm_fusion_ext.errors import InputError
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.runtime import CompiledModel

ort = pytest.importorskip("onnxruntime")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _model(node, inputs, inits=(), extra_nodes=()):
    graph = helper.make_graph([*extra_nodes, node], "g", inputs, [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                              list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _save(model, tmp_path, name):
    path = str(tmp_path / f"{name}.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


def _gather_nd(tmp_path):
    node = helper.make_node("GatherND", ["data", "idx"], ["y"], name="gather")
    return _save(_model(node, [helper.make_tensor_value_info("data", TP.FLOAT, [2, 5]),
                               helper.make_tensor_value_info("idx", TP.INT64, ["n", 2])]), tmp_path, "gather_nd")


def _gather_elements(tmp_path):
    node = helper.make_node("GatherElements", ["data", "idx"], ["y"], name="gather", axis=1)
    return _save(_model(node, [helper.make_tensor_value_info("data", TP.FLOAT, [2, 5]),
                               helper.make_tensor_value_info("idx", TP.INT64, [2, "k"])]), tmp_path, "gather_el")


def _scatter_nd(tmp_path):
    node = helper.make_node("ScatterND", ["data", "idx", "upd"], ["y"], name="scatter")
    return _save(_model(node, [helper.make_tensor_value_info("data", TP.FLOAT, [4, 3]),
                               helper.make_tensor_value_info("idx", TP.INT64, ["n", 1]),
                               helper.make_tensor_value_info("upd", TP.FLOAT, ["n", 3])]), tmp_path, "scatter_nd")


def _scatter_elements(tmp_path):
    node = helper.make_node("ScatterElements", ["data", "idx", "upd"], ["y"], name="scatter", axis=1)
    return _save(_model(node, [helper.make_tensor_value_info("data", TP.FLOAT, [2, 5]),
                               helper.make_tensor_value_info("idx", TP.INT64, [2, "k"]),
                               helper.make_tensor_value_info("upd", TP.FLOAT, [2, "k"])]), tmp_path, "scatter_el")


def _positions(tmp_path):
    """``GatherND(data [L, 3], Unsqueeze(Range(0, len(x)), 1))``: rows 0 .. len(x) - 1 of data, indices the
    model computes from another input's shape."""
    nodes = [helper.make_node("Shape", ["x"], ["sx"], name="shape"),
             helper.make_node("Gather", ["sx", "zero"], ["t"], name="len", axis=0),
             helper.make_node("Range", ["zero", "t", "one"], ["pos"], name="range"),
             helper.make_node("Unsqueeze", ["pos", "axis1"], ["idx"], name="unsq")]
    inits = [numpy_helper.from_array(np.asarray(v, np.int64), n) for n, v in
             (("zero", 0), ("one", 1), ("axis1", [1]))]
    node = helper.make_node("GatherND", ["data", "idx"], ["y"], name="gather")
    return _save(_model(node, [helper.make_tensor_value_info("data", TP.FLOAT, ["L", 3]),
                               helper.make_tensor_value_info("x", TP.FLOAT, ["T"])], inits, nodes),
                 tmp_path, "positions")


def _both(path, feeds):
    got = CompiledModel.from_module(load_onnx(path)).run(feeds)["y"]
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return got, ref


def _refused(path, feeds):
    with pytest.raises(InputError) as err:
        CompiledModel.from_module(load_onnx(path)).run(feeds)
    assert "\n" not in str(err.value)
    return str(err.value)


DATA = np.arange(10, dtype=np.float32).reshape(2, 5)


def test_gather_nd_negative_indices_count_from_the_end(tmp_path):
    idx = np.array([[0, 1], [1, 4], [1, -1], [-2, -5], [-1, 0]], np.int64)
    got, ref = _both(_gather_nd(tmp_path), {"data": DATA, "idx": idx})
    np.testing.assert_array_equal(ref, [1, 9, 9, 0, 5])  # ONNX's meaning, by ONNX Runtime
    np.testing.assert_array_equal(got, ref)  # TVM's kernel alone read [1, -1] as [0, 4]


@pytest.mark.parametrize("bad, axis", [([1, 5], 1), ([2, 0], 0), ([0, -6], 1), ([-3, 1], 0)])
def test_gather_nd_index_outside_the_data_is_refused(tmp_path, bad, axis):
    idx = np.array([[0, 1], bad, bad], np.int64)
    msg = _refused(_gather_nd(tmp_path), {"data": DATA, "idx": idx})
    span = "-5 .. 4" if axis else "-2 .. 1"
    assert msg == f"model: input 'idx' holds 2 values outside {span}, the indices GatherND can read along dim " \
                  f"{axis} of its data", msg


def test_token_ids_past_the_vocabulary_are_refused(tmp_path):
    """ONNX Gather (TVM's ``take``, clamped by ClampGatherIndices): a bad id read the table's last row."""
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    node = helper.make_node("Gather", ["table", "ids"], ["y"], name="embed", axis=0)
    path = _save(_model(node, [helper.make_tensor_value_info("ids", TP.INT64, ["b", "s"])],
                        [numpy_helper.from_array(table, "table")]), tmp_path, "embed")
    ids = np.array([[0, 5, -1], [-6, 2, 3]], np.int64)
    got, ref = _both(path, {"ids": ids})
    np.testing.assert_array_equal(got, table[ids % 6])
    np.testing.assert_array_equal(got, ref)
    msg = _refused(path, {"ids": np.array([[0, 6, 1]], np.int64)})
    assert msg == "model: input 'ids' holds 1 value outside -6 .. 5, the indices Gather can read along dim 0 of " \
                  "its data", msg


def test_gather_elements_negative_and_outside(tmp_path):
    path = _gather_elements(tmp_path)
    idx = np.array([[0, -1, 4], [-5, 2, -2]], np.int64)
    got, ref = _both(path, {"data": DATA, "idx": idx})
    np.testing.assert_array_equal(ref, np.take_along_axis(DATA, idx % 5, axis=1))
    np.testing.assert_array_equal(got, ref)
    msg = _refused(path, {"data": DATA, "idx": np.array([[0, 5, 1], [0, 1, 2]], np.int64)})
    assert "input 'idx' holds 1 value outside -5 .. 4, the indices GatherElements can read along dim 1" in msg, msg


def test_scatter_nd_writes_inside_the_data_or_refuses(tmp_path):
    path = _scatter_nd(tmp_path)
    data, upd = np.zeros((4, 3), np.float32), np.ones((2, 3), np.float32) * [[1], [2]]
    got, ref = _both(path, {"data": data, "idx": np.array([[-1], [1]], np.int64), "upd": upd.astype(np.float32)})
    np.testing.assert_array_equal(ref[[3, 1]], upd)
    np.testing.assert_array_equal(got, ref)
    msg = _refused(path, {"data": data, "idx": np.array([[4], [1]], np.int64), "upd": upd.astype(np.float32)})
    assert "input 'idx' holds 1 value outside -4 .. 3, the indices ScatterND can read along dim 0" in msg, msg


def test_scatter_elements_negative_indices_and_outside(tmp_path):
    """TVM's importer leaves ScatterElements' negative indices to the kernel: normalised by the check's pass."""
    path = _scatter_elements(tmp_path)
    upd = np.array([[10, 20], [30, 40]], np.float32)
    got, ref = _both(path, {"data": DATA, "idx": np.array([[-1, 0], [-5, 3]], np.int64), "upd": upd})
    np.testing.assert_array_equal(ref, [[20, 1, 2, 3, 10], [30, 6, 7, 40, 9]])
    np.testing.assert_array_equal(got, ref)
    msg = _refused(path, {"data": DATA, "idx": np.array([[-6, 0], [1, 5]], np.int64), "upd": upd})
    assert "input 'idx' holds 2 values outside -5 .. 4, the indices ScatterElements can read along dim 1" in msg, msg


def test_computed_positions_past_a_shorter_input_are_refused(tmp_path):
    """The KV-cache mask case: ONNX Runtime refuses (GatherND: invalid index); TVM read past ``data``."""
    path = _positions(tmp_path)
    data = np.arange(24, dtype=np.float32).reshape(8, 3)
    for t in (1, 5, 8):
        got, ref = _both(path, {"data": data, "x": np.zeros(t, np.float32)})
        np.testing.assert_array_equal(got, data[:t])
        np.testing.assert_array_equal(got, ref)
    msg = _refused(path, {"data": data[:6], "x": np.zeros(8, np.float32)})
    assert "input 'data' of shape (6, 3) is indexed past its dim 0 by GatherND (2 indices the model computes" in msg
    with pytest.raises(Exception, match="invalid index"):  # ONNX Runtime refuses the same inputs
        ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(
            None, {"data": data[:6], "x": np.zeros(8, np.float32)})


def test_constant_indices_in_range_get_no_check(tmp_path):
    """The check costs a reduction and a host read: skipped where the indices are a constant inside static dims,
    added where they are computed (the counter proves the pass fired)."""
    from tvm import relax

    from tvm_fusion_ext.compile.checks.gather_indices import CheckGatherIndices
    from tvm_fusion_ext.testing import build_module

    data = relax.Var("data", relax.TensorType([2, 5], "float32"))
    for idx, checks in (([[0, 1], [1, 4]], 0), ([[0, 1], [1, -1]], 2), ([[2, 0]], 2)):
        const = relax.const(np.array(idx), "int64")
        mod = build_module([data], lambda bb, const=const: relax.op.gather_nd(data, const))
        assert CheckGatherIndices()(mod).script().count("R.tensor_to_shape") == checks, idx
    computed = CheckGatherIndices()(load_onnx(_positions(tmp_path))).script()
    assert computed.count("R.tensor_to_shape") == 1 and "R.Shape([0, 7734, 1, 1, 0, 0, 0, 0])" in computed
    # an ONNX constant, negative: normalised by TVM's importer, checked, and read as ONNX means it
    inits = [numpy_helper.from_array(np.array([[0, 1], [1, -1]], np.int64), "idx")]
    node = helper.make_node("GatherND", ["data", "idx"], ["y"], name="gather")
    path = _save(_model(node, [helper.make_tensor_value_info("data", TP.FLOAT, [2, 5])], inits), tmp_path, "const")
    got, ref = _both(path, {"data": DATA})
    np.testing.assert_array_equal(got, [1, 9])
    np.testing.assert_array_equal(got, ref)


@pytest.mark.slow  # a runtime-only subprocess (25 s); tests/deploy/test_runtime_only.py covers that path by default
def test_refused_in_one_line_where_only_the_runtime_is_installed(tmp_path):
    """The check is the VM's own (no Python callback): a runtime-only deployment refuses the same way."""
    from tvm_fusion_ext.compile import compile_artifact

    art = str(tmp_path / "art")
    compile_artifact(_positions(tmp_path), art)
    feeds = tmp_path / "x.npz"
    np.savez(feeds, data=np.zeros((6, 3), np.float32), x=np.zeros(8, np.float32))
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    r = subprocess.run([sys.executable, "-m", "tvm_fusion_ext.cli", "run", art, "--inputs", str(feeds),
                        "--output", str(tmp_path / "y.npz")], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "input 'data' of shape (6, 3) is indexed past its dim 0 by GatherND" in lines[0], \
        r.stderr
