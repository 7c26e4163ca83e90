"""Pool collection on a tiny task: the journal, resuming after a kill, the pool file round trip, and the
expert features read from scheduled kernels."""

import json

import numpy as np
import pytest


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """Six real candidates of the tiny dense's template space, built and measured (a few seconds)."""
    from tvm_fusion_ext.tools.tuning_lab.collect import CollectOptions, collect, work_dir

    root = str(tmp_path_factory.mktemp("pools"))
    meta = collect(root, CollectOptions(task="tiny-dense", space="template", count=6, batch=6, random_first=3,
                                        progress=None), command="test")
    return work_dir(root, "tiny-dense", "template"), meta


def test_journal_holds_every_candidate_with_what_the_replay_needs(collected):
    from tvm_fusion_ext.tools.tuning_lab.collect import read_records

    directory, meta = collected
    recs = read_records(directory)
    assert meta["candidates"] == 6 and [r["id"] for r in recs] == list(range(6))
    assert recs[0]["origin"] == "default"                     # the template's own decisions come first
    assert len({r["hash"] for r in recs}) == 6
    for r in recs:
        assert r["run_secs"] and len(r["run_secs"]) == 3 and min(r["run_secs"]) > 0
        assert len(r["features"]) >= 1 and all(len(row) == 164 for row in r["features"])
        assert len(r["loadavg"]) == 3 and r["expert_rule"] is None
    assert meta["machine"]["cores"] >= 1 and meta["tvm"] and meta["task"] == "tiny-dense"


def test_traces_replay_to_the_measured_module(collected):
    import tvm_ffi

    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.tune.expert import check
    from tvm_fusion_ext.tools.tuning_lab.collect import prepare_task, read_records, trace_of

    directory, _ = collected
    task = prepare_task("tiny-dense", "template", resolve_target("llvm"))
    for rec in read_records(directory):
        sch, _ = trace_of(rec, task.mod)
        assert "%016x" % (int(tvm_ffi.structural_hash(sch.mod)) & (2**64 - 1)) == rec["hash"]
        assert check(sch.mod["main"], resolve_target("llvm")) == rec["expert_rule"]


def test_pack_and_load_round_trip(collected, tmp_path):
    from tvm_fusion_ext.tools.tuning_lab.collect import latency_us, read_records
    from tvm_fusion_ext.tools.tuning_lab.pool_file import load, pack

    directory, _ = collected
    out = str(tmp_path / "tiny.npz")
    assert "6 candidates" in pack(directory, out)
    pool = load(out, traces=True)
    recs = read_records(directory)
    assert len(pool) == 6 and pool.name == "tiny-dense-template"
    np.testing.assert_allclose(pool.latency_us, [latency_us(r) for r in recs], rtol=1e-6)
    for i, r in enumerate(recs):
        np.testing.assert_array_equal(pool.store_features(i), np.asarray(r["features"], np.float32))
        assert pool.traces[i] == r["trace"]
    assert pool.expert_features.shape == (6, len(pool.meta["expert_feature_names"]))
    assert np.all(np.isfinite(pool.expert_features))


def test_killed_collector_resumes_without_losing_records(collected, tmp_path, monkeypatch):
    """A collector killed mid-write leaves a partial line: the rerun cuts it, keeps every complete record
    byte for byte and measures only what is missing."""
    import shutil

    from tvm_fusion_ext.tools.tuning_lab import collect as pl

    directory, _ = collected
    root = tmp_path / "root"
    copy = root / "tiny-dense-template"
    shutil.copytree(directory, copy)
    journal = copy / pl.CANDIDATES_FILE
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:4]) + lines[4][: len(lines[4]) // 2])   # killed while writing #5
    kept = b"".join(lines[:4])

    measured = []

    def fake_measure(self, schedules):   # the resume logic is under test here, not the runner
        measured.extend(schedules)
        return [{"build_s": 0.0, "build_error": None, "run_error": None, "run_secs": [1e-5, 1e-5, 1e-5],
                 "loadavg": [0.0, 0.0, 0.0], "runnable": 1} for _ in schedules]

    monkeypatch.setattr(pl.Bench, "__init__", lambda self, target, opts: None)
    monkeypatch.setattr(pl.Bench, "measure", fake_measure)
    meta = pl.collect(str(root), pl.CollectOptions(task="tiny-dense", space="template", count=9, batch=3,
                                                   progress=None))
    recs = pl.read_records(str(copy))
    assert journal.read_bytes().startswith(kept)
    assert meta["candidates"] == 9 and [r["id"] for r in recs] == list(range(9))
    assert len(measured) == 5 and len({r["hash"] for r in recs}) == 9


def test_unknown_task_and_missing_space_are_one_line_errors(capsys):
    from tvm_fusion_ext.errors import FusionExtError
    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.tools.tuning_lab.collect import prepare_task
    from tvm_fusion_ext.tools.tuning_lab.pool_cli import main

    assert main(["pack", "/nonexistent/dir", "--out", "/tmp/x.npz"]) == 2
    assert "not a pool collection directory" in capsys.readouterr().err
    with pytest.raises(FusionExtError, match="unknown pool task"):
        prepare_task("resnet", "auto", resolve_target("llvm"))


def test_expert_features_see_parallelism_vectors_and_register_tiles():
    """Two schedules of the same dense whose differences the features must show, read from the IR."""
    from tvm import s_tir

    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.tune.expert_features import FEATURE_NAMES, candidate_features
    from tvm_fusion_ext.tools.tuning_lab.collect import prepare_task

    target = resolve_target("llvm")
    task = prepare_task("tiny-dense", "template", target)
    sch = s_tir.Schedule(task.mod)
    task.spaces[0].trace.apply_to_schedule(sch, remove_postproc=False)
    tuned = dict(zip(FEATURE_NAMES, candidate_features(sch.mod, target)))
    plain = dict(zip(FEATURE_NAMES, candidate_features(task.mod, target)))   # unscheduled: serial, scalar
    assert tuned["parallel_extent_log2"] > 0 and plain["parallel_extent_log2"] == 0
    assert plain["parallel_balance"] == pytest.approx(1 / int(target.attrs["num-cores"]))
    assert tuned["vector_fraction"] > 0.5 and plain["vector_fraction"] == 0
    assert tuned["vector_contiguous"] == 1.0
    # the template keeps an mr x nr accumulator tile in registers; the plain nest reduces one scalar
    assert tuned["register_tile_ratio"] > plain["register_tile_ratio"] > 0
    assert tuned["threads_per_block_ratio"] == 0  # CPU
    json.dumps({k: float(v) for k, v in tuned.items()})


def _ssrsrs_dense(i2: int, i3: int, j2: int, j3: int):
    """A 64x64x64 dense tiled as MetaSchedule's CPU sketch does (i0 j0 | k0 | i2 j2 | k1 | i3 j3)."""
    import tvm
    from tvm import s_tir, te

    a = te.placeholder((64, 64), name="A")
    b = te.placeholder((64, 64), name="B")
    k = te.reduce_axis((0, 64), name="k")
    c = te.compute((64, 64), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    sch = s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([a, b, c])}))
    blk = sch.get_sblock("C")
    i, j, kk = sch.get_loops(blk)
    i0, i_2, i_3 = sch.split(i, [None, i2, i3])
    j0, j_2, j_3 = sch.split(j, [None, j2, j3])
    k0, k1 = sch.split(kk, [None, 4])
    sch.reorder(i0, j0, k0, i_2, j_2, k1, i_3, j_3)
    sch.parallel(sch.fuse(i0, j0))
    sch.vectorize(j_3)
    return sch.mod


@pytest.mark.parametrize("tile, outer, inner", [((4, 1, 1, 16), 3.0, 1.0),     # 4x16 accumulators: 8 ymm
                                                 ((1, 1, 1, 16), 1.0, 1.0),     # 1x16: 2 ymm, FMA latency bound
                                                 ((2, 2, 2, 8), 3.0, 1.0),      # 4x16 again, split differently
                                                 ((8, 2, 2, 16), 6.0, 2.0)])    # 16x32: spills
def test_accumulator_features_count_the_register_tile_a_reduction_step_updates(tile, outer, inner):
    """What separates a fast MetaSchedule dense from one 3.7x slower with the same inner tile (BERT's FFN pool:
    i2=4 against i2=1 under j3=16) is the tile of accumulators inside the outermost reduction loop, in vector
    registers; the innermost reduction loop's tile is the same for both."""
    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.tune.expert_features import FEATURE_NAMES, Machine, candidate_features

    avx2 = Machine(cores=2, lanes=8, register_bytes=16 * 32, l1_bytes=32 * 1024, l2_bytes=512 * 1024)
    feats = dict(zip(FEATURE_NAMES, candidate_features(_ssrsrs_dense(*tile), resolve_target("llvm"), avx2)))
    assert feats["accumulator_vectors_log2"] == pytest.approx(outer)
    assert feats["inner_accumulator_vectors_log2"] == pytest.approx(inner)


# times every candidate for several rounds (20 s): once, in the slow tier
@pytest.mark.slow
def test_remeasure_times_every_candidate_in_rounds_and_keeps_the_collected_figure(collected, tmp_path, capsys):
    """The re-measured latency is the minimum over interleaved rounds; the collector's figure is kept, also
    when a pool is re-measured twice, and ``info`` says how the figures were taken."""
    from tvm_fusion_ext.tools.tuning_lab.pool_cli import main
    from tvm_fusion_ext.tools.tuning_lab.pool_file import describe, load, pack
    from tvm_fusion_ext.tools.tuning_lab.pool_remeasure import remeasure

    directory, _ = collected
    packed = str(tmp_path / "tiny.npz")
    pack(directory, packed)
    collected_us = load(packed).latency_us
    once, twice = str(tmp_path / "once.npz"), str(tmp_path / "twice.npz")
    said = []
    assert "6 of 6 candidates re-measured in 3 rounds" in remeasure(packed, once, rounds=3, threads=1,
                                                                    say=said.append)
    assert sum("round" in s for s in said) == 3
    pool = load(once, traces=True)
    assert pool.rounds_us.shape == (6, 3) and np.all(pool.rounds_us > 0)
    np.testing.assert_allclose(pool.latency_us, pool.rounds_us.min(axis=1), rtol=1e-6)
    np.testing.assert_array_equal(pool.first_latency_us, collected_us)
    assert pool.rounds_load.shape == (3, 4)
    assert pool.meta["remeasured"]["threads"] == 1 and "minimum over rounds" in pool.meta["remeasured"]["protocol"]
    assert pool.traces == load(packed, traces=True).traces                  # everything else is carried over
    np.testing.assert_array_equal(pool.expert_features, load(packed).expert_features)
    assert main(["remeasure", once, "--out", twice, "--rounds", "1", "--threads", "1"]) == 0
    again = load(twice)
    np.testing.assert_array_equal(again.first_latency_us, collected_us)   # not the first re-measurement
    assert again.rounds_us.shape == (6, 1)
    assert "re-measured" in describe(twice) and "1 thread(s)" in describe(twice)
    capsys.readouterr()
    assert main(["remeasure", once, "--rounds", "0"]) == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err


# rebuilds and times the tiny pool for another CPU (20 s): in the slow tier
@pytest.mark.slow
def test_remeasure_retargets_a_pool_to_another_cpu(collected, tmp_path, capsys):
    """``--target`` rebuilds every trace for that CPU and makes the file describe it: target, the expert rules'
    verdicts and the expert features recomputed for it, the old target kept; its records are then that
    target's warm-start source. The pool's own target, or another kind of target, does not re-target."""
    from tvm_fusion_ext import records
    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.tune.expert import RULES, check
    from tvm_fusion_ext.tune.expert_features import candidate_features, machine_of
    from tvm_fusion_ext.tools.tuning_lab.pool_cli import main
    from tvm_fusion_ext.tools.tuning_lab.pool_file import load, pack, schedule_of, workload_of
    from tvm_fusion_ext.tools.tuning_lab.pool_records import export_records

    directory, _ = collected
    packed, moved, same = (str(tmp_path / n) for n in ("tiny.npz", "avx2.npz", "same.npz"))
    pack(directory, packed)
    here = load(packed)
    assert main(["remeasure", packed, "--out", moved, "--rounds", "1", "--threads", "1",
                 "--target", "llvm:x86-64-v3"]) == 0
    pool = load(moved, traces=True)
    avx2 = resolve_target("llvm:x86-64-v3")
    assert pool.meta["target_label"] == records.target_label(avx2) != here.meta["target_label"]
    assert pool.meta["retargeted"]["from_target_label"] == here.meta["target_label"]
    assert np.all(np.isfinite(pool.latency_us)) and pool.rounds_us.shape == (6, 1)
    np.testing.assert_array_equal(pool.first_latency_us, here.latency_us)
    target, mod = workload_of(pool)
    assert records.target_label(target) == records.target_label(avx2)
    for i in range(len(pool)):                       # verdicts and features are the new target's
        func = schedule_of(pool, i, mod).mod["main"]
        rule = check(func, target)
        assert pool.expert_rule[i] == (0 if rule is None else 1 + list(RULES).index(rule))
        np.testing.assert_allclose(pool.expert_features[i], candidate_features(schedule_of(pool, i, mod).mod,
                                                                             target, machine_of(target)),
                                   rtol=1e-5, atol=1e-6)
    assert records.target_label(avx2) in export_records(moved, str(tmp_path / "warm"))
    assert main(["remeasure", packed, "--out", same, "--rounds", "1", "--threads", "1", "--target", "llvm"]) == 0
    assert "retargeted" not in load(same).meta and load(same).meta["target_label"] == here.meta["target_label"]
    capsys.readouterr()
    assert main(["remeasure", packed, "--out", same, "--target", "cuda"]) == 2
    assert "cannot be re-targeted to cuda" in capsys.readouterr().err


def test_refeature_adds_new_expert_columns_and_keeps_the_measurements(collected, tmp_path, capsys):
    """A pool packed before a feature existed gets it from its traces; the old columns come out unchanged and
    nothing measured is touched."""
    from tvm_fusion_ext.tune.expert_features import FEATURE_NAMES
    from tvm_fusion_ext.tools.tuning_lab.pool_cli import main
    from tvm_fusion_ext.tools.tuning_lab.pool_file import load, pack, save
    from tvm_fusion_ext.tools.tuning_lab.pool_refeature import refeature

    directory, _ = collected
    packed, old, new = (str(tmp_path / f"{n}.npz") for n in ("packed", "old", "new"))
    pack(directory, packed)
    pool = load(packed, traces=True)
    dropped = "accumulator_vectors_log2"
    keep = [i for i, n in enumerate(FEATURE_NAMES) if n != dropped]
    pool.expert_features = pool.expert_features[:, keep]
    pool.meta = dict(pool.meta, expert_feature_names=[FEATURE_NAMES[i] for i in keep])
    save(pool, old)
    said = refeature(old, new, say=lambda m: None)
    assert f"added {dropped}; changed none" in said
    again, before = load(new, traces=True), load(packed, traces=True)
    assert list(again.meta["expert_feature_names"]) == list(FEATURE_NAMES)
    np.testing.assert_array_equal(again.expert_features, before.expert_features)
    np.testing.assert_array_equal(again.latency_us, before.latency_us)
    assert again.traces == before.traces
    assert main(["refeature", new]) == 0 and "added none; changed none" in capsys.readouterr().out
    assert main(["refeature", str(tmp_path / "missing.npz")]) == 2


def test_pool_exports_as_records_a_live_run_warm_starts_from(collected, tmp_path, capsys):
    """``pool records`` turns a pool's measured candidates into a record directory that ``--warm-start`` reads:
    one record per measured candidate, its trace replaying on the task, its latency as the run time."""
    from tvm_fusion_ext import records
    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.tune.intrin_stub import stub_tensor_intrinsics
    from tvm_fusion_ext.tools.tuning_lab.pool_cli import main
    from tvm_fusion_ext.tools.tuning_lab.pool_file import load, pack
    from tvm_fusion_ext.tune.rank_model import RankModel
    from tvm_fusion_ext.tune.warm_start import record_dirs, warm_start

    directory, _ = collected
    packed, out = str(tmp_path / "tiny.npz"), str(tmp_path / "warm" / "tiny")
    pack(directory, packed)
    pool = load(packed)
    assert main(["records", packed, "--out", out]) == 0
    assert "6 measured candidates of pool" in capsys.readouterr().out
    assert record_dirs(str(tmp_path / "warm")) == [out]
    recs = records.open_database(out).get_all_tuning_records()
    assert len(recs) == 6
    np.testing.assert_allclose(sorted(float(r.run_secs[0]) * 1e6 for r in recs), sorted(pool.latency_us), rtol=1e-6)
    model = RankModel()
    with stub_tensor_intrinsics(True):   # TuneContext would import the tensor-core intrinsics: 30 s, unused on llvm
        stats = warm_start(model, [out], resolve_target("llvm"))
    assert stats.records == 6 and stats.unreplayable == 0 and stats.other_target == 0
    assert main(["records", packed, "--out", out]) == 2          # never appends to (or mixes) a directory
    assert "already holds tuning records" in capsys.readouterr().err


def test_knob_strategies_read_the_decisions_from_the_pool_file(collected, tmp_path):
    """``rank-knobs`` reads each candidate's decisions from the stored traces (loaded on demand)."""
    from tvm_fusion_ext.tools.tuning_lab import replay as rp
    from tvm_fusion_ext.tune.knob_features import knob_values
    from tvm_fusion_ext.tools.tuning_lab.pool_file import load, pack
    from tvm_fusion_ext.tools.tuning_lab.replay_models import candidate_rows

    directory, _ = collected
    out = str(tmp_path / "tiny.npz")
    pack(directory, out)
    pool = load(out)                                   # traces not loaded
    rows = candidate_rows(pool, expert=True, store=False, knobs=True)
    n_knobs = len(knob_values(load(out, traces=True).traces[0]))
    assert n_knobs > 0 and rows.shape[0] == 6
    assert np.isfinite(rows[:, pool.expert_features.shape[1]:][:, :n_knobs]).all()
    result = rp.search(pool, rp.STRATEGIES["rank-knobs"], seed=1, budget=6, k=2)
    assert sorted(result.order.tolist()) == list(range(6))


def test_shipped_pools_describe_the_target_their_directory_names():
    """A pool under ``tuning_pools/<target label>/`` was re-targeted to that CPU (so its records warm-start
    runs there) and keeps where it came from; every shipped pool has a measured latency for most candidates."""
    import glob
    import os

    from tvm_fusion_ext.tools.tuning_lab.pool_file import load

    root = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tuning_pools")
    moved = sorted(glob.glob(os.path.join(root, "*", "*.npz")))
    assert moved, "no re-targeted pool is shipped"
    for path in moved:
        pool = load(path)
        label = os.path.basename(os.path.dirname(path))
        original = load(os.path.join(root, os.path.basename(path)))
        assert pool.meta["target_label"] == label != original.meta["target_label"]
        assert pool.meta["retargeted"]["from_target_label"] == original.meta["target_label"]
        assert len(pool) == len(original) and np.isfinite(pool.latency_us).mean() > 0.99
        np.testing.assert_array_equal(pool.first_latency_us, original.first_latency_us)
