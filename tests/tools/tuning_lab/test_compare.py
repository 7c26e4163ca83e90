"""The XGBoost-vs-random benchmark's bookkeeping (the tuning runs themselves are a benchmark, not a test)."""

import json

from tvm_fusion_ext.tools.tuning_lab.compare import compare_histories, format_rows, latencies_by_task, trials_to_within


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


def test_histories_give_trials_to_randoms_final_best():
    guided = [5.0, 4.0, None, 2.0, 1.5]
    rand = [6.0, 3.0, 2.5, 2.6]
    row = compare_histories(guided, rand, 1, "t", "rank")
    assert row["guided_to_random_best"] == 4 and row["random_to_own_best"] == 3   # 2.0 <= 2.5 at trial 4
    assert row["guided_at_least_random"] is True and row["guided_best_us"] == 1.5e6
    never = compare_histories([9.0, 8.0], rand, 2, "t", "rank")
    assert never["guided_to_random_best"] == 3 and never["guided_at_least_random"] is False   # budget + 1
    failed = compare_histories([None, None], [None], 3, "t", "rank")
    assert failed["guided_to_random_best"] is None and failed["guided_at_least_random"] is None


def test_format_rows_gives_medians_and_ratio():
    rows = [dict(compare_histories([3.0] * 9 + [1.0], [3.0] * 29 + [1.2], s, "t", "rank"),
                 guided_own=10, random_own=30, guided_common=10, random_common=40) for s in (1, 2)]
    text = format_rows(rows)
    assert "median trials to random's best: rank 10, random 30, ratio 0.33" in text
    assert "median trials to 5% (own): rank 10, random 30, ratio 0.33" in text
    assert "median trials to 5% (common): rank 10, random 40, ratio 0.25" in text
    assert "rank's final best at least as good as random's: 2 of 2" in text
