"""The XGBoost-vs-random benchmark's bookkeeping (the tuning runs themselves are a benchmark, not a test)."""

import json

from tvm_fusion_ext.tune.compare import format_rows, latencies_by_task, trials_to_within


def test_trials_to_within_counts_the_running_best():
    history = [5.0, None, 3.0, 4.0, 2.0, 2.05]
    assert trials_to_within(history, 2.0 * 1.05) == 5
    assert trials_to_within(history, 3.0) == 3
    assert trials_to_within(history, 1.0) is None
    assert trials_to_within([], 1.0) is None


def test_latencies_in_record_order_with_failures(tmp_path):
    lines = [[0, ["trace", [0.002, 0.004], "target", []]],
             [0, ["trace", [1e10], "target", []]],           # a failed candidate
             [0, ["trace", [0.001], "target", []]]]
    (tmp_path / "database_tuning_record.json").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (tmp_path / "manifest.json").write_text(json.dumps({"tasks": {"fused_dense": {"trials": 3},
                                                                   "reshape": {"trials": 0}}}))
    assert latencies_by_task(str(tmp_path)) == {"fused_dense": [0.003, None, 0.001]}


def test_format_rows_gives_medians_and_ratio():
    rows = [{"seed": s, "task": "t", "xgb_own": 10, "random_own": 30, "xgb_common": 10, "random_common": 40,
             "xgb_best_us": 1.0, "random_best_us": 1.2} for s in (1, 2)]
    text = format_rows(rows)
    assert "median trials to 5% (own): xgb 10, random 30, ratio 0.33" in text
    assert "median trials to 5% (common): xgb 10, random 40, ratio 0.25" in text
