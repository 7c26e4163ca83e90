"""``bench --kernels``' ONNX Runtime side (tools/bench/ort_profile.py): ORT's own profiler summed per operator type.

The summary is checked on a hand-written event list (warm-up calls dropped, medians over calls, node names
counted once), and a real profile against ORT's optimized graph, written by a session with the same options: every
node of that graph runs once per call, so the profile must name exactly its operator types and node counts."""

import collections

import numpy as np
import onnx
import pytest

from tvm_fusion_ext.models import sample_inputs
from tvm_fusion_ext.tools.bench.ort_profile import OpTime, OrtProfile, profile_ort, summarize


def _run(ts, dur):
    return {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur}


def _node(name, op, ts, dur):
    return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}}


def test_summary_drops_warm_up_calls_and_takes_medians():
    events = [
        _run(0, 5000), _node("mm0", "MatMul", 10, 4000),                     # the warm-up call: dropped
        _run(10_000, 3000), _node("mm0", "MatMul", 10_010, 1000), _node("mm1", "MatMul", 10_020, 500),
        _node("ln", "LayerNormalization", 10_030, 200),
        {"cat": "Node", "name": "mm0_fence_before", "ts": 10_040, "dur": 0},  # not a kernel's time
        _run(20_000, 4000), _node("mm0", "MatMul", 20_010, 2000), _node("mm1", "MatMul", 20_020, 1000),
        _node("ln", "LayerNormalization", 20_030, 400),
        _run(30_000, 1000), _node("mm0", "MatMul", 30_010, 300), _node("mm1", "MatMul", 30_020, 300),
        _node("late", "Softmax", 31_500, 99),                                # after the call ended: no call's
    ]
    p = summarize(events, warmup=1)
    assert p.runs == 3 and p.profiled_ms == pytest.approx(3.0)
    by_op = {o.op: o for o in p.ops}
    assert set(by_op) == {"MatMul", "LayerNormalization"}
    assert by_op["MatMul"].nodes == 2 and by_op["MatMul"].ms == pytest.approx(1.5)      # median of 1.5, 3.0, 0.6
    # a call where an operator did not run counts as 0 for it
    assert by_op["LayerNormalization"].ms == pytest.approx(0.2)                       # median of 0.2, 0.4, 0
    assert [o.op for o in p.ops] == ["MatMul", "LayerNormalization"]
    d = p.to_dict()
    assert d["ops_ms"] == pytest.approx(1.7) and sum(o["share"] for o in d["ops"]) == pytest.approx(1.0)
    assert "| MatMul | 2 | 1.500 |" in p.table()


def test_summary_folds_the_tail_and_refuses_a_profile_without_calls():
    p = OrtProfile([OpTime(f"Op{i}", 1, 1.0) for i in range(5)], 5.0, 1)
    assert "| 3 other operator types | 3 | 3.000 |" in p.table(top=2)
    with pytest.raises(ValueError, match="no call after the 2 warm-up calls"):
        summarize([_run(0, 10), _run(20, 10)], warmup=2)


def test_profile_names_every_node_of_ort_optimized_graph(tiny_encoder_path, tmp_path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = 1
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(tiny_encoder_path, opts, providers=["CPUExecutionProvider"])
    want = collections.Counter(n.op_type for n in onnx.load(opts.optimized_model_filepath).graph.node)

    feeds = sample_inputs(tiny_encoder_path, seed=0)
    p = profile_ort(tiny_encoder_path, dict(feeds, not_an_input=np.zeros(1)), threads=1, spin=False, runs=3)
    assert {o.op: o.nodes for o in p.ops} == dict(want)
    assert p.runs == 3 and all(o.ms >= 0 for o in p.ops) and 0 < p.ops_ms <= p.profiled_ms
    with pytest.raises(ValueError, match="runs must be positive"):
        profile_ort(tiny_encoder_path, feeds, threads=1, spin=False, runs=0)


def test_bench_reports_an_unreadable_profile_and_keeps_its_table(tiny_encoder_path, tmp_path, capsys, monkeypatch):
    import json

    from tvm_fusion_ext.cli import main
    from tvm_fusion_ext.tools.bench import ort_profile

    def broken(events, warmup):
        raise ValueError("ONNX Runtime's profile holds no call after the 2 warm-up calls")

    monkeypatch.setattr(ort_profile, "summarize", broken)
    out_json = tmp_path / "b.json"
    assert main(["bench", tiny_encoder_path, "--against", "ort", "--repeat", "2", "--kernels",
                 "--json", str(out_json)]) == 0
    printed = capsys.readouterr().out
    r = json.loads(out_json.read_text())
    assert r["ort_kernels"] == {"error": "ONNX Runtime's profile holds no call after the 2 warm-up calls"}
    assert "ONNX Runtime's profile not available: ONNX Runtime's profile holds no call" in printed
    assert r["kernels"]["runs"] == 2 and r["ratio_vs_ort"] > 0  # ours and the timed comparison are unaffected
