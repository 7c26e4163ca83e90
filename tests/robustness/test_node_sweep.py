"""ONNX's single-operator backend cases through ``tvm-fusion run`` (the fallback never crashes).

Every case must end in a result equal to ONNX's expected output or in one ``error:`` line naming the op and node;
an internal error, a wrong answer, a crash or a timeout fails the test. By default a deterministic subset runs:
one case per op type (every op at least once) plus the cases that once failed (``REGRESSION_CASES``). The full
sweep (about 1,900 cases) is opt-in::

    TFX_NODE_SWEEP=full python -m pytest -q tests/robustness/test_node_sweep.py -m slow

or, with the table for docs/coverage.md, "Operator coverage", ``python tests/robustness/node_sweep.py --workers 2``.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import node_sweep  # noqa: E402

pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def case_root():
    """The node cases: onnx's shipped data, else generated once (about 20 s) into a cache shared between runs."""
    return node_sweep.node_case_dir(os.path.join(tempfile.gettempdir(), "tfx-onnx-node-cases"))


def _failures(results) -> str:
    bad = [r for r in results if r.outcome == "failed"]
    return "\n".join(f"{r.case} ({', '.join(r.ops)}): {r.kind}: {r.detail}" for r in bad)


@pytest.mark.slow
def test_every_op_once_and_past_failures(case_root):
    names = node_sweep.case_names(case_root)
    subset = node_sweep.representative_subset(case_root, names)
    regressions = [n for n in node_sweep.REGRESSION_CASES if n in names]
    assert len(regressions) == len(node_sweep.REGRESSION_CASES), "a regression case is missing from this onnx"
    chosen = sorted(set(subset) | set(regressions))
    results = node_sweep.sweep(case_root, chosen, workers=1)  # one TVM import (10 s on a busy box) is the floor
    covered = {op for r in results for op in r.ops}
    assert covered == {op for n in names for op in node_sweep.case_ops(case_root, n)}
    failures = _failures(results)
    assert not failures, f"{failures.count(chr(10)) + 1} of {len(results)} cases failed:\n{failures}"
    by_outcome = {o: sum(r.outcome == o for r in results) for o in ("pass", "refused")}
    # the sweep is not vacuous: most ops build and match, and refusals are the documented kinds
    assert by_outcome["pass"] > len(results) // 3, by_outcome
    assert all(not r.kind.startswith("other") for r in results if r.outcome == "refused"), \
        [r.detail for r in results if r.kind.startswith("other")]


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TFX_NODE_SWEEP") != "full",
                    reason="the full ONNX node sweep takes minutes; set TFX_NODE_SWEEP=full to run it")
def test_full_sweep(case_root):
    names = node_sweep.case_names(case_root)
    results = node_sweep.sweep(case_root, names, workers=int(os.environ.get("TFX_NODE_SWEEP_WORKERS", "2")))
    failures = _failures(results)
    assert not failures, f"{failures.count(chr(10)) + 1} of {len(results)} cases failed:\n{failures}"


# -- the harness's own judgement -----------------------------------------------------------------------------------
def test_compare_tolerates_rounding_not_errors():
    want = np.array([1.0, 2.0, np.nan, np.inf], "float32")
    assert node_sweep.compare("y", want + np.float32(1e-6), want) == ""
    assert "1 of 4 elements differ" in node_sweep.compare("y", want * np.array([1, 1.01, 1, 1], "float32"), want)
    assert "shape" in node_sweep.compare("y", want[:3], want)
    assert "dtype" in node_sweep.compare("y", want.astype("float64"), want)
    assert "differ" in node_sweep.compare("y", np.array([1, 2], "int64"), np.array([1, 3], "int64"))
    assert "missing" in node_sweep.compare("y", None, want)


def test_classify_separates_refusals_from_failures():
    expected = [("y", np.zeros(2, "float32"))]
    ok = {"y": np.zeros(2, "float32")}
    assert node_sweep.classify(0, "", ok, expected)[0] == "pass"
    assert node_sweep.classify(0, "", {"y": np.ones(2, "float32")}, expected)[:2] == ("failed", "wrong")
    line = "error: m.onnx: op 'Foo' (node 'n') is not supported by TVM's ONNX importer"
    assert node_sweep.classify(2, line + "\n", None, expected) == ("refused", "op not in TVM's ONNX importer", line)
    # a second line (a TVM warning after ours) makes a refusal unclean
    assert node_sweep.classify(2, line + "\nWarning: BlockBuilder destroyed\n", None, expected)[:2] == \
        ("failed", "unclean")
    assert node_sweep.classify(1, "error: internal error in 'run': X\n", None, expected)[:2] == ("failed", "internal")


def test_a_crashing_case_is_attributed_to_it(tmp_path):
    """A worker that dies mid-case (TVM aborting the process) fails that case only; the sweep goes on."""
    import shutil

    root = tmp_path / "node"
    good = _write_case(root, "test_relu", "Relu", np.array([-1.0, 2.0], "float32"), np.array([0.0, 2.0], "float32"))
    shutil.copytree(good, root / "test_relu_again")
    _write_case(root, "test_abort", "Relu", np.array([1.0], "float32"), np.array([1.0], "float32"))
    os.environ["NODE_SWEEP_ABORT_CASE"] = "test_abort"  # the worker aborts as TVM's C++ would
    try:
        results = node_sweep.sweep(str(root), ["test_abort", "test_relu", "test_relu_again"], workers=1)
    finally:
        del os.environ["NODE_SWEEP_ABORT_CASE"]
    outcomes = {r.case: (r.outcome, r.kind) for r in results}
    assert outcomes == {"test_abort": ("failed", "crash"), "test_relu": ("pass", ""),
                        "test_relu_again": ("pass", "")}


def _write_case(root, name, op, x, y):
    import onnx
    from onnx import helper, numpy_helper

    case = root / name
    (case / "test_data_set_0").mkdir(parents=True)
    tx = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x.shape))
    ty = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, list(y.shape))
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], name, [tx], [ty])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(case / "model.onnx"))
    (case / "test_data_set_0" / "input_0.pb").write_bytes(numpy_helper.from_array(x, "x").SerializeToString())
    (case / "test_data_set_0" / "output_0.pb").write_bytes(numpy_helper.from_array(y, "y").SerializeToString())
    return case
