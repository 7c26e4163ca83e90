"""Cost-model choice of the tuner (``--cost-model xgb|random``) and the attention kernel as a tuning task."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

ENCODER = dict(num_layers=1, hidden=32, heads=2, intermediate=64, seq=16)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    import onnx

    from tvm_fusion_ext.models import build_encoder_onnx

    path = str(tmp_path_factory.mktemp("model") / "tiny.onnx")
    onnx.save(build_encoder_onnx(**ENCODER), path)
    return path


@pytest.fixture(scope="module")
def random_logs(tiny_path, tmp_path_factory):
    """4 trials of the tiny encoder tuned with random scores, through the CLI: (logs root, record dir)."""
    from tvm_fusion_ext.cli import main

    logs = tmp_path_factory.mktemp("random_logs")
    assert main(["tune", tiny_path, "--target", "llvm", "--trials", "4", "--per-iter", "2", "--population", "16",
                 "--cost-model", "random", "--logs", str(logs)]) == 0
    (sub,) = [d for d in os.listdir(logs) if d.startswith("tiny-")]
    return str(logs), os.path.join(logs, sub)


def test_random_cost_model_from_cli_writes_records_and_manifest(random_logs):
    from tvm_fusion_ext.records import open_database

    path = random_logs[1]
    with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["cost_model"] == "random"
    records = open_database(path).get_all_tuning_records()
    assert len(records) == manifest["trials"] == 4
    measured = [t for t in manifest["tasks"].values() if t["trials"] > 0]
    assert measured and all(t["best_us"] is not None for t in measured)
    # random scores are not predictions: no rank correlation may be reported for them
    assert all((t.get("quality") or {}).get("predicted_pairs", 0) == 0 for t in measured)


def test_unknown_cost_model_is_rejected(tiny_path, tmp_path):
    from tvm_fusion_ext.cli import main
    from tvm_fusion_ext.errors import FusionExtError
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.tune.driver import TuneOptions, tune

    with pytest.raises(SystemExit):
        main(["tune", tiny_path, "--cost-model", "gbdt", "--logs", str(tmp_path)])
    with pytest.raises(FusionExtError, match="cost model"):
        tune(load_onnx(tiny_path), "llvm", logs=str(tmp_path), options=TuneOptions(cost_model="gbdt", progress=None))
    assert not os.listdir(tmp_path)  # rejected before anything was written


def test_attention_kernel_is_a_tuning_task(tiny_path):
    """The fused attention kernel has no Let expression any more, so MetaSchedule can count its FLOPs and the
    driver hands it to the tuner with its template space instead of skipping it."""
    from tvm_fusion_ext.compile import lower
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.transform.pipeline import SemanticFusion
    from tvm_fusion_ext.tune.driver import extract_tasks

    target = resolve_target("llvm")
    tasks, skipped = extract_tasks(lower(SemanticFusion()(load_onnx(tiny_path)), target), target)
    attention = [t for t in tasks if t.rule is not None and "attention" in t.rule]
    assert len(attention) == 1, ([t.name for t in tasks], skipped)
    assert attention[0].flops is not None and attention[0].flops > 0
    assert not any("attention" in name for name, _ in skipped)


# ----------------------------------------------------------------------------------------------- warm start

def _candidates(record_dir):
    from tvm_fusion_ext.records import open_database

    recs = open_database(record_dir).get_all_tuning_records()
    return recs[0].workload.mod, [recs[0].as_measure_candidate()]


def test_warm_start_trains_xgb_on_records_of_this_target(random_logs):
    from tvm.s_tir import meta_schedule as ms

    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.tune.intrin_stub import stub_tensor_intrinsics
    from tvm_fusion_ext.tune.warm_start import warm_start

    target = resolve_target("llvm")
    model = ms.cost_model.XGBModel(num_warmup_samples=2)
    with stub_tensor_intrinsics(True):  # as the driver does on llvm: TuneContext imports a 30 s registry otherwise
        stats = warm_start(model, [random_logs[1]], target)
        mod, cands = _candidates(random_logs[1])
        ctx = ms.TuneContext(mod=mod, target=target, task_name="check", num_threads=1)
    assert stats.records == 4 and stats.workloads == 4 and stats.other_target == 0
    assert model.booster is not None and model.data_size == 4
    # trained: predictions are the model's (deterministic), not the random numbers of an untrained XGBModel
    np.testing.assert_array_equal(model.predict(ctx, cands), model.predict(ctx, cands))
    cold = ms.cost_model.XGBModel(num_warmup_samples=2)
    assert not np.array_equal(cold.predict(ctx, cands * 8), cold.predict(ctx, cands * 8))


def test_warm_start_skips_records_of_another_target(random_logs):
    from tvm.s_tir import meta_schedule as ms

    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.tune.intrin_stub import stub_tensor_intrinsics
    from tvm_fusion_ext.tune.warm_start import warm_start

    other = resolve_target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
    model = ms.cost_model.XGBModel(num_warmup_samples=2)
    with stub_tensor_intrinsics(True):
        stats = warm_start(model, [random_logs[1]], other)
    assert stats.records == 0 and stats.other_target == 4 and model.booster is None


@pytest.mark.slow  # 15 s of tuning through the CLI
def test_warm_start_from_cli_is_in_the_manifest(tiny_path, random_logs, tmp_path):
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.tune.driver import TuneOptions, tune

    messages = []
    manifest = tune(load_onnx(tiny_path), "llvm", logs=str(tmp_path), workload="tiny",
                    options=TuneOptions(trials=1, per_iter=2, population=16, warm_start=(random_logs[0],),
                                        progress=messages.append))
    assert manifest["warm_start"]["records"] == 4 and manifest["warm_start"]["sources"] == [random_logs[1]]
    assert manifest["cost_model"] == "handover"  # the default with --warm-start (the replay's winner)
    assert any("warm-started on 4 records of 4 kernels" in m for m in messages), messages
    # the progress line: best so far and the time left at this run's pace (the budget is spent: 0s)
    lines = [m for m in messages if m.startswith("tune: trials")]
    assert lines and all(" best " in m and " | ETA " in m for m in lines), messages
    assert lines[-1].split(" | ETA ")[1].split(" ")[0] == "0s", lines[-1]


def test_default_is_the_ranker_when_no_warm_start_record_is_for_this_target(tiny_path, random_logs, tmp_path):
    """The handover was measured only with transfer: if every ``--warm-start`` record is another CPU's, the
    default picks as it does without ``--warm-start``, and says so. An explicit ``handover`` stays."""
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.tune.driver import TuneOptions, tune

    other_cpu = "llvm:x86-64-v3"  # runs on any x86-64 with AVX2; the records are this machine's
    for asked, used in (("auto", "rank"), ("handover", "handover")):
        messages = []
        manifest = tune(load_onnx(tiny_path), other_cpu, logs=str(tmp_path / asked), workload="tiny",
                        options=TuneOptions(trials=1, per_iter=2, population=16, warm_start=(random_logs[0],),
                                            cost_model=asked, progress=messages.append))
        assert manifest["warm_start"]["records"] == 0 and manifest["warm_start"]["skipped_other_target"] == 4
        assert manifest["cost_model"] == used, manifest["cost_model"]
        assert any("no --warm-start record is for this target" in m for m in messages) == (asked == "auto")


def test_progress_durations_read_as_a_person_would():
    from tvm_fusion_ext.tune.progress import format_duration

    assert [format_duration(s) for s in (0.4, 59, 61, 3599, 3600, 7325)] == ["0s", "59s", "1m01s", "59m59s",
                                                                            "1h00m", "2h02m"]


@pytest.mark.parametrize("extra, message", [
    (["--warm-start", "/nonexistent/logs"], "is not a directory"),
    (["--warm-start", "."], "holds no tuning-record directories"),
    (["--warm-start", "RECORDS", "--cost-model", "random"], "needs --cost-model rank, handover or xgb"),
])
def test_warm_start_errors_are_one_line(tiny_path, random_logs, tmp_path, capsys, extra, message):
    from tvm_fusion_ext.cli import main

    extra = [random_logs[1] if a == "RECORDS" else str(tmp_path) if a == "." else a for a in extra]
    rc = main(["tune", tiny_path, "--trials", "2", "--logs", str(tmp_path / "out"), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()  # refused before anything was written


# ----------------------------------------------------------------------------------------------- rank model

def _tiny_dense_candidates(n):
    """``n`` distinct schedules of the tiny dense's template space (random knobs), as measure candidates."""
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.schedule import Trace

    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.tools.tuning_lab.collect import prepare_task

    target = resolve_target("llvm")
    task = prepare_task("tiny-dense", "template", target)
    out, seen, seed = [], set(), 0
    while len(out) < n and seed < 50 * n:
        seed += 1
        sch = s_tir.Schedule(task.mod, seed=seed)
        Trace(task.spaces[0].trace.insts, {}).apply_to_schedule(sch, remove_postproc=True)
        key = str(sch.trace)
        if key in seen:
            continue
        seen.add(key)
        out.append(ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)))
    return target, task, out


def test_rank_model_learns_the_order_of_candidates_it_has_not_seen():
    """Synthetic costs that depend on the schedule (its expert features): trained on 24 candidates, the model
    orders 12 others; before warm-up it gives random scores."""
    from scipy.stats import spearmanr
    from tvm.s_tir import meta_schedule as ms

    from tvm_fusion_ext.tune.intrin_stub import stub_tensor_intrinsics
    from tvm_fusion_ext.tune.expert_features import FEATURE_NAMES, candidate_features
    from tvm_fusion_ext.tune.rank_model import RankModel

    with stub_tensor_intrinsics(True):
        target, task, cands = _tiny_dense_candidates(36)
        assert len(cands) == 36
        feats = [dict(zip(FEATURE_NAMES, candidate_features(c.sch.mod, target))) for c in cands]
        cost = np.array([1e-6 * (1 + 4 * (1 - f["vector_fraction"]) + 2 / (1 + f["register_tile_ratio"])
                                 + f["unroll_log2"] / 8) for f in feats])
        ctx = ms.TuneContext(mod=task.mod, target=target, task_name="rank", num_threads=1)
        model = RankModel(target, num_warmup_samples=8)
        cold = model.predict(ctx, cands[24:])
        assert not np.array_equal(cold, model.predict(ctx, cands[24:]))          # random before warm-up
        results = [ms.runner.RunnerResult(run_secs=[float(c)] * 3, error_msg=None) for c in cost[:24]]
        results[3] = ms.runner.RunnerResult(run_secs=None, error_msg="failed")  # ranks below every success
        model.update(ctx, cands[:24], results)
        assert model.booster is not None and model.data_size == 24
        pred = model.predict(ctx, cands[24:])
        np.testing.assert_array_equal(pred, model.predict(ctx, cands[24:]))    # the model's, deterministic
    # a higher score means faster: the order must follow -cost on the unseen candidates
    assert spearmanr(pred, -cost[24:]).correlation > 0.5, (pred, cost[24:])


@pytest.mark.slow  # 19 s of tuning through the CLI
@pytest.mark.parametrize("cost_model", ["rank", "handover"])
def test_ranking_cost_models_tune_from_the_cli_and_warm_start(tiny_path, random_logs, tmp_path, cost_model):
    from tvm_fusion_ext.cli import main

    logs = tmp_path / cost_model
    assert main(["tune", tiny_path, "--target", "llvm", "--trials", "4", "--per-iter", "2", "--population", "16",
                 "--cost-model", cost_model, "--warm-start", random_logs[0], "--logs", str(logs)]) == 0
    (sub,) = [d for d in os.listdir(logs) if d.startswith("tiny-")]
    with open(os.path.join(logs, sub, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["cost_model"] == cost_model and manifest["trials"] == 4
    assert manifest["warm_start"]["records"] == 4


def test_rank_scores_are_positive_and_keep_the_order():
    """Evolutionary search clips scores below 0 and samples parents in proportion to the rest."""
    from tvm_fusion_ext.tune.rank_model import positive_scores

    scores = positive_scores([-3.0, 0.5, -7.0, 2.0])
    assert np.all(scores > 0) and scores.max() == 1.0
    assert np.argsort(scores).tolist() == [2, 0, 1, 3]


def test_rank_model_warm_start_is_a_fixed_base_that_the_run_continues(tmp_path):
    """Other tasks' records (``--warm-start``) become a base booster: it scores candidates before this run has
    measured anything, and the run's own trees continue its margins instead of being trained among them."""
    from scipy.stats import spearmanr
    from tvm.s_tir import meta_schedule as ms

    from tvm_fusion_ext.tune.intrin_stub import stub_tensor_intrinsics
    from tvm_fusion_ext.tune.expert_features import FEATURE_NAMES, candidate_features
    from tvm_fusion_ext.tune.rank_model import RankModel

    with stub_tensor_intrinsics(True):
        target, task, cands = _tiny_dense_candidates(36)
        feats = [dict(zip(FEATURE_NAMES, candidate_features(c.sch.mod, target))) for c in cands]
        cost = np.array([1e-6 * (1 + 4 * (1 - f["vector_fraction"]) + 2 / (1 + f["register_tile_ratio"])
                                 + f["unroll_log2"] / 8) for f in feats])
        ctx = ms.TuneContext(mod=task.mod, target=target, task_name="rank", num_threads=1)
        model = RankModel(target, num_warmup_samples=8, pretrain_rounds=40)
        # the "other task": the first 24 candidates, as warm_start feeds them
        model.update(ctx, cands[:24], [ms.runner.RunnerResult(run_secs=[float(c)], error_msg=None) for c in cost[:24]])
        model.freeze_as_base()
        assert model.base is not None and model.booster is None and model.data_size == 0 and not model.groups
        cold = model.predict(ctx, cands[24:])
        np.testing.assert_array_equal(cold, model.predict(ctx, cands[24:]))  # the base's, not random
        assert spearmanr(cold, -cost[24:]).correlation > 0.5
        # this run's own measurements: trees on top of the base's margins
        model.update(ctx, cands[24:32], [ms.runner.RunnerResult(run_secs=[float(c)], error_msg=None)
                                          for c in cost[24:32]])
        assert model.booster is not None and model.data_size == 8
        warm = model.predict(ctx, cands[32:])
        assert spearmanr(warm, -cost[32:]).correlation > 0.3
        model.save(str(tmp_path / "rank.pkl"))
        twin = RankModel(target)
        twin.load(str(tmp_path / "rank.pkl"))
        np.testing.assert_array_equal(twin.predict(ctx, cands[32:]), warm)


def test_handover_model_hands_each_kernel_over_after_its_own_trials(tmp_path):
    """``--cost-model handover``: the ranker predicts a kernel's candidates until ``at`` of that kernel's trials
    are measured, XGBModel after; both learn from every measurement, warm-start records count for their own
    kernel only, and the warm-start protocol (``last_train_size``, ``freeze_as_base``) reaches both parts."""
    from tvm.s_tir import meta_schedule as ms

    from tvm_fusion_ext.tune.intrin_stub import stub_tensor_intrinsics
    from tvm_fusion_ext.tune.handover_model import HandoverModel
    from tvm_fusion_ext.tune.rank_model import RankModel

    with stub_tensor_intrinsics(True):
        target, task, cands = _tiny_dense_candidates(24)
        ctx = ms.TuneContext(mod=task.mod, target=target, task_name="handover", num_threads=1)
        rank = RankModel(target, num_warmup_samples=2, pretrain_rounds=20)
        xgb = ms.cost_model.XGBModel(num_warmup_samples=2)
        model = HandoverModel(rank, xgb, at=8)
        results = [ms.runner.RunnerResult(run_secs=[1e-6 * (1 + i % 5)], error_msg=None) for i in range(24)]
        model.last_train_size = 7
        assert rank._inst.last_train_size == 7 and xgb._inst.last_train_size == 7
        model.last_train_size = 0
        assert model.picker(ctx) is rank._inst
        model.update(ctx, cands[:4], results[:4])
        assert model.picker(ctx) is rank._inst  # 4 of 8
        np.testing.assert_array_equal(model.predict(ctx, cands[12:]), rank.predict(ctx, cands[12:]))
        model.update(ctx, cands[4:8], results[4:8])
        assert model.picker(ctx) is xgb._inst
        assert rank._inst.data_size == 8 and xgb._inst.data_size == 8  # both learned from both batches
        np.testing.assert_array_equal(model.predict(ctx, cands[12:]), xgb.predict(ctx, cands[12:]))
        model.freeze_as_base()
        assert rank._inst.base is not None and xgb._inst.data_size == 8  # XGBModel keeps the records as data
        model.save(str(tmp_path / "handover"))
        assert sorted(os.listdir(tmp_path / "handover")) == ["rank.pkl", "xgb"]
