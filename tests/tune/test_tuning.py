"""The tuning driver on CPU with tiny budgets: records that the build applies, both spaces, resume, RPC
address errors, and expert rules rejecting an over-limit CUDA candidate unbuilt.

Killed runs (``kill -9``, repeatedly, then resumed) and measurement through an RPC tracker and server on
127.0.0.1 (including the server dying mid-run) are in ``tests/robustness/test_faults.py``."""

from __future__ import annotations

import json
import logging
import os
import socket

import numpy as np
import pytest

ENCODER = dict(num_layers=1, hidden=32, heads=2, intermediate=64, seq=16)
TINY = dict(per_iter=2, population=16)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.models import build_encoder_onnx

    path = str(tmp_path_factory.mktemp("model") / "tiny.onnx")
    import onnx

    onnx.save(build_encoder_onnx(**ENCODER), path)
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 100, (1, ENCODER["seq"])).astype("int64"),
             "attention_mask": np.ones((1, ENCODER["seq"]), "int64")}
    feeds["attention_mask"][0, -3:] = 0
    return path, load_onnx(path), feeds


@pytest.fixture(scope="module")
def lowered(model):
    """The lowering the build runs, for checking that records name its PrimFuncs."""
    from tvm_fusion_ext.compile import lower
    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.transform.pipeline import SemanticFusion

    return lower(SemanticFusion()(model[1]), resolve_target("llvm"))


@pytest.fixture(scope="module")
def reference(model):
    """Untuned build's outputs (templates with default knobs)."""
    from tvm_fusion_ext.runtime import CompiledModel

    return CompiledModel.from_module(model[1], "llvm").run(model[2])


def _tune(mod, logs, trials, **kw):
    from tvm_fusion_ext.tune.driver import TuneOptions, tune

    return tune(mod, "llvm", logs=str(logs), workload="tiny",
                options=TuneOptions(trials=trials, progress=None, **{**TINY, **kw}))


def _record_dir(root):
    (sub,) = [d for d in os.listdir(root) if d.startswith("tiny-")]
    return os.path.join(root, sub)


def _records(path):
    from tvm_fusion_ext.records import open_database

    db = open_database(path)
    return db, [(str(r.trace), [float(s) for s in r.run_secs]) for r in db.get_all_tuning_records()]


def _check_records_apply(path, manifest, lowered, target):
    """Every task the manifest says was tuned has a record, and its workload is a PrimFunc of the build's
    lowering (so ``build(..., logs=)`` finds it): queried through MetaSchedule's own database API."""
    import tvm
    import tvm_ffi

    db, _ = _records(path)
    funcs = [f for _, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    tuned = [name for name, t in manifest["tasks"].items() if t["trials"] > 0 and t["best_us"] is not None]
    assert tuned, manifest
    workloads = {int(tvm_ffi.structural_hash(r.workload.mod)): r.workload.mod for r in db.get_all_tuning_records()}
    assert len(workloads) == len(tuned)
    for mod in workloads.values():
        rec = db.query_tuning_record(mod, target, "main")
        assert rec is not None and rec.run_secs
        main = mod["main"].without_attr("global_symbol")
        assert any(tvm_ffi.structural_equal(main, f.without_attr("global_symbol")) for f in funcs)
    return tuned


class _WatchedHandler(logging.Handler):
    """An application's handler: unnamed, like most; remembers whether someone closed it."""

    closed = False

    def emit(self, record):
        pass

    def close(self):
        self.closed = True
        super().close()


@pytest.fixture(scope="module")
def template_logs(model, tmp_path_factory):
    """Tuned with an unnamed handler on MetaSchedule's logger and one on the root logger, as an embedding
    application (or pytest, or Jupyter) may have them; MetaSchedule's own logger set-up crashed on the first
    and closed the second."""
    root = tmp_path_factory.mktemp("logs_template")
    ms_logger, app_logger = logging.getLogger("tvm.s_tir.meta_schedule"), logging.getLogger()
    watched = (_WatchedHandler(), _WatchedHandler())
    ms_logger.addHandler(watched[0])
    app_logger.addHandler(watched[1])
    try:
        manifest = _tune(model[1], root, trials=4, space="template")
        attached = (watched[0] in ms_logger.handlers, watched[1] in app_logger.handlers)
    finally:
        ms_logger.removeHandler(watched[0])
        app_logger.removeHandler(watched[1])
    return root, manifest, watched, attached


def test_tuning_leaves_the_callers_logging_alone(template_logs):
    root, manifest, watched, attached = template_logs
    assert attached == (True, True)
    assert not any(h.closed for h in watched)
    # each task still gets its own log file
    logs = os.listdir(os.path.join(_record_dir(root), "logs"))
    assert sum(name.startswith("task_") and name.endswith(".log") for name in logs) == len(manifest["tasks"])


def test_template_records_apply_in_build(model, template_logs, lowered, reference):
    from tvm_fusion_ext.runtime import CompiledModel
    from tvm_fusion_ext.targets import resolve_target

    root, manifest = template_logs[:2]
    path = _record_dir(root)
    assert manifest["trials"] == 4 and manifest["target"].startswith("llvm")
    tuned = _check_records_apply(path, manifest, lowered, resolve_target("llvm"))
    assert all(manifest["tasks"][t]["space"] == "template" for t in tuned)
    # light tasks were not given trials
    assert any(why == "elementwise" for why in manifest["skipped"].values())
    out = CompiledModel.from_module(model[1], "llvm", logs=path).run(model[2])
    for name, ref in reference.items():
        np.testing.assert_allclose(out[name], ref, rtol=1e-4, atol=1e-4)


# tunes the auto space and builds with its records (30 s): once, in the slow tier
@pytest.mark.slow
def test_auto_space_records_apply_in_build(model, lowered, reference, tmp_path):
    from tvm_fusion_ext.runtime import CompiledModel
    from tvm_fusion_ext.targets import resolve_target

    manifest = _tune(model[1], tmp_path, trials=4, space="auto", scheduler="round-robin")
    path = _record_dir(tmp_path)
    tuned = _check_records_apply(path, manifest, lowered, resolve_target("llvm"))
    assert all(manifest["tasks"][t]["space"] == "auto" for t in tuned)
    assert manifest["scheduler"] == "round-robin"
    out = CompiledModel.from_module(model[1], "llvm", logs=path).run(model[2])
    for name, ref in reference.items():
        np.testing.assert_allclose(out[name], ref, rtol=1e-4, atol=1e-4)


def test_resume_keeps_records_and_tops_up(model, template_logs):
    from tvm_fusion_ext.records import read_manifest, select

    root = template_logs[0]
    path = _record_dir(root)
    _, before = _records(path)
    manifest = _tune(model[1], root, trials=6)
    _, after = _records(path)
    assert len(after) == 6 and manifest["trials"] == 6
    assert all(rec in after for rec in before)  # nothing lost or rewritten
    # the resumed run's cost model started from the 4 records already there, not from nothing
    assert manifest["warm_start"]["records"] == 4 and manifest["warm_start"]["sources"] == [path]
    # asking for what is already there measures nothing
    _tune(model[1], root, trials=6)
    assert len(_records(path)[1]) == 6 and read_manifest(path)["trials"] == 6
    # a root of record directories picks the one matching this model and target
    import tvm_fusion_ext.targets as targets

    chosen, msg = select(str(root), model[1], targets.resolve_target("llvm"))
    assert chosen == path and path in msg


def test_select_reports_no_match(tmp_path, template_logs):
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.models import build_encoder_onnx
    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.records import select

    root = template_logs[0]
    other = load_onnx(build_encoder_onnx(**{**ENCODER, "seed": 1}))
    chosen, msg = select(str(root), other, resolve_target("llvm"))
    assert chosen is None and "no tuning records" in msg


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rpc_errors_are_one_line():
    from tvm_fusion_ext.errors import FusionExtError
    from tvm_fusion_ext.tune.remote import make_runner

    with pytest.raises(FusionExtError, match="HOST:PORT"):
        make_runner("nohost", "k")
    with pytest.raises(FusionExtError, match="cannot reach"):
        make_runner(f"127.0.0.1:{_free_port()}", "k")


# ----------------------------------------------------------------------------------------------- expert rules

def _matmul_mod(n: int = 512):
    import tvm
    from tvm import te

    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), "k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def _cuda_matmul(tile: int, sch=None):
    from tvm import s_tir

    sch = sch if sch is not None else s_tir.Schedule(_matmul_mod())
    blk = sch.get_sblock("C")
    i, j, kk = sch.get_loops(blk)
    i0, i1 = sch.split(i, [None, tile])
    j0, j1 = sch.split(j, [None, tile])
    k0, _ = sch.split(kk, [None, 64])
    sch.reorder(i0, j0, k0, i1, j1)
    sch.bind(i0, "blockIdx.y")
    sch.bind(j0, "blockIdx.x")
    for idx in (0, 1):  # A and B tiles of tile x 64 fp32 each in shared memory
        sch.compute_at(sch.cache_read(blk, idx, "shared"), k0)
    _, t = sch.split(sch.fuse(i1, j1), [None, 128])
    sch.bind(t, "threadIdx.x")
    return sch


def test_expert_rules_reject_over_limit_shared_memory_before_build():
    from tvm.s_tir import meta_schedule as ms

    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.tune.expert import ExpertRules, RuleStats

    target = resolve_target("cuda:sm_90")
    limit = int(target.attrs["max_shared_memory_per_block"])
    assert 2 * 128 * 64 * 4 > limit >= 2 * 16 * 64 * 4  # the two schedules below straddle the limit
    stats = RuleStats()
    rules = ExpertRules(stats, target)
    assert rules.apply(_cuda_matmul(16)) is True
    assert rules.apply(_cuda_matmul(128)) is False
    assert stats.to_dict()["rejected"]["shared_memory"] == 1 and stats.checked == 2

    # Inside MetaSchedule: the candidate is dropped while candidates are generated, i.e. before any builder.
    from tvm_fusion_ext.tune.intrin_stub import stub_tensor_intrinsics

    space = ms.space_generator.ScheduleFn(lambda sch: _cuda_matmul(128, sch), sch_rules=[],
                                          postprocs=[ExpertRules(stats)], mutator_probs={})
    with stub_tensor_intrinsics(True):  # TuneContext imports the 30 s tensor-intrinsic registry otherwise
        ctx = ms.TuneContext(mod=_matmul_mod(), target=target, space_generator=space,
                             search_strategy=ms.search_strategy.ReplayTrace(), task_name="over", rand_state=1,
                             num_threads=1)
        ctx.pre_tuning(max_trials=4, num_trials_per_iter=4, design_spaces=ctx.generate_design_space())
        candidates = ctx.generate_measure_candidates()
    assert not candidates  # nothing reaches a builder
    assert stats.to_dict()["rejected"]["shared_memory"] > 1


def test_expert_vector_rule_on_cpu():
    import tvm
    from tvm import s_tir, te

    from tvm_fusion_ext.targets import TargetInfo, resolve_target
    from tvm_fusion_ext.tune.expert import check

    target = resolve_target("llvm")
    lanes = TargetInfo.of(target).lanes()

    def vec(n):
        a = te.placeholder((n,), name="A")
        b = te.compute((n,), lambda i: a[i] * 2.0, name="B")
        sch = s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([a, b])}))
        sch.vectorize(sch.get_loops(sch.get_sblock("B"))[0])
        return sch.mod["main"]

    assert check(vec(2 * lanes), target) is None
    assert check(vec(lanes // 2), target) is None
    assert check(vec(lanes + 1), target) == "vector_width"


# ----------------------------------------------------------------------------------------------- small pieces

def test_quality_metrics():
    from tvm_fusion_ext.tune.quality import spearman, task_quality, trials_to_within

    x = [0.3, 0.1, 0.7, 0.5]
    assert spearman(x, [2 * v + 1 for v in x]) == pytest.approx(1.0)
    assert spearman(x, [-v for v in x]) == pytest.approx(-1.0)
    assert spearman(x[:2], x[:2]) is None
    lat = [5e-6, None, 3e-6, 2.05e-6, 2e-6]
    assert trials_to_within(lat) == 4
    q = task_quality([(lat_, None if lat_ is None else 1 / lat_) for lat_ in lat])
    assert q["failed"] == 1 and q["spearman"] == pytest.approx(1.0) and q["trials_to_5pct"] == 4


def test_repair_cuts_only_the_partial_last_line(tmp_path):
    from tvm_fusion_ext.errors import TuningLogError
    from tvm_fusion_ext.records import RECORD_FILE, WORKLOAD_FILE, repair

    (tmp_path / WORKLOAD_FILE).write_bytes(b'["1", "a"]\n["2", "b"]\n["3", ')
    (tmp_path / RECORD_FILE).write_bytes(b'[0, 1]\n[1, 2]\n')
    assert repair(str(tmp_path)) == 1
    assert (tmp_path / WORKLOAD_FILE).read_bytes() == b'["1", "a"]\n["2", "b"]\n'
    assert (tmp_path / RECORD_FILE).read_bytes() == b'[0, 1]\n[1, 2]\n'
    (tmp_path / WORKLOAD_FILE).write_bytes(b'["1", "a"]\n["2\n["3", "c"]\n')
    with pytest.raises(TuningLogError, match="corrupt"):
        repair(str(tmp_path))


def test_cli_parser_registers_tune():
    from tvm_fusion_ext.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["tune", "m.onnx", "--target", "cuda:sm_90", "--trials", "8", "--logs", "L",
                              "--space", "auto", "--rpc", "127.0.0.1:9190", "--key", "h100",
                              "--scheduler", "round-robin"])
    assert (args.target, args.trials, args.logs, args.space, args.rpc, args.key, args.scheduler) == \
        ("cuda:sm_90", 8, "L", "auto", "127.0.0.1:9190", "h100", "round-robin")
    with pytest.raises(SystemExit):
        parser.parse_args(["tune", "m.onnx", "--space", "bogus"])


# ---------------------------------------------------------------------------------------------------------
# CUDA candidates built here (no GPU): --build-only
# ---------------------------------------------------------------------------------------------------------

needs_nvcc = pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc is not on PATH")


@needs_nvcc
@pytest.mark.slow
def test_build_only_cli_compiles_sm90_candidates(model, capsys):
    from tvm_fusion_ext.cli import main

    assert main(["tune", model[0], "--target", "cuda:sm_90", "--build-only", "1", "--json"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out[out.index("{"):])
    assert report["target"] == "sm_90" and report["tasks"]
    for name, task in report["tasks"].items():
        assert task["candidates"] >= 1 and task["built"] == task["candidates"], (name, task)
        assert task["expert_rules"]["checked"] >= task["candidates"]  # every built one passed the rules first
    assert "candidates built for sm_90" in out


@pytest.mark.slow  # 8.5 s
@needs_nvcc
def test_build_only_fp16_candidates_use_tensor_core_templates(model, mma_attention):
    from tvm_fusion_ext.tools.inspect_cuda import convert_dtype
    from tvm_fusion_ext.tune.check_candidates import check_candidates

    report = check_candidates(convert_dtype(model[1], "float16"), "cuda:sm_80", per_task=1, say=None,
                              only=("fused_attention", "fused_dense_gelu"))
    tasks = report["tasks"]
    assert sorted(tasks) == ["fused_attention", "fused_dense_gelu"], tasks
    assert all(t["built"] == t["candidates"] >= 1 for t in tasks.values()), tasks


def test_expert_register_rule_counts_mma_fragments_per_lane():
    """A warp-wide [32, 8] fragment buffer is 8 values per thread: the template's own defaults must pass."""
    import tvm
    from tvm import relax, s_tir

    from tvm_fusion_ext.ops.registry import make_prim_func
    from tvm_fusion_ext.schedules.registry import get_template
    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.tune.expert import check

    target = resolve_target("cuda:sm_80")
    ty = lambda s: relax.TensorType(list(s), "float16")  # noqa: E731
    func = make_prim_func("fused_dense", {"x": ty((1, 128, 384)), "w": ty((384, 1536)), "bias": ty((1536,))},
                          {"act": "gelu"})
    sch = s_tir.Schedule(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))
    block = next(b for b in sch.get_child_blocks(sch.get_sblock("root"))
                 if str(sch.get(b).annotations.get("schedule_rule", "")) == "tfx.dense")
    get_template("tfx.dense", target)(sch, block, target)
    assert "mma" in sch.mod.script()  # the tensor-core template
    assert check(sch.mod["main"], target) is None


@pytest.mark.slow  # ~40 s: a tuning run and a build in a second process
def test_int8_records_name_the_dot_product_kernel_and_apply_in_a_fresh_process(model, tmp_path):
    """``tune --precision int8``: the dense tasks are tuned on the template (its trace tensorizes with the
    target's dot-product intrinsic), and a build in a new process, which has not scheduled an int8 kernel yet,
    replays them (the intrinsic is registered before the records are) to the untuned build's outputs."""
    import pathlib
    import subprocess
    import sys

    from tvm_fusion_ext.runtime import CompiledModel
    from tvm_fusion_ext.tune.driver import TuneOptions, tune

    path, mod, feeds = model
    # one trial for each of the six template tasks (four int8 denses, layernorm, attention): which tasks a smaller
    # budget reaches depends on the scheduler's order
    manifest = tune(mod, "llvm", logs=str(tmp_path / "logs"), workload="tiny", precision="int8",
                    options=TuneOptions(trials=6, progress=None, space="template", **TINY))
    assert any("row quantization" in why for why in manifest["skipped"].values()), manifest["skipped"]
    dense = {name: t for name, t in manifest["tasks"].items() if name.startswith("fused_dense_int8")}
    assert dense and all(t["trials"] > 0 and t["best_us"] is not None for t in dense.values()), manifest["tasks"]
    (logs,) = [str(p) for p in (tmp_path / "logs").iterdir() if p.name.startswith("tiny-int8-")]
    np.savez(tmp_path / "feeds.npz", **feeds)
    script = (
        "import sys, numpy as np\n"
        "from tvm_fusion_ext.frontend import load_onnx\n"
        "from tvm_fusion_ext.runtime import CompiledModel\n"
        "feeds = dict(np.load(sys.argv[2]))\n"
        "out = CompiledModel.from_module(load_onnx(sys.argv[1]), 'llvm', logs=sys.argv[3], precision='int8')"
        ".run(feeds)\n"
        "np.savez(sys.argv[4], **out)\n")
    root = pathlib.Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", script, path, str(tmp_path / "feeds.npz"),
                    logs, str(tmp_path / "out.npz")], cwd=root, check=True, timeout=600)
    got = dict(np.load(tmp_path / "out.npz"))
    want = CompiledModel.from_module(mod, "llvm", precision="int8").run(feeds)
    for name, ref in want.items():
        np.testing.assert_array_equal(got[name], ref)  # int32 accumulation: any schedule gives the same bits


def test_dynamic_inputs_are_refused_with_how_to_pin_them(tmp_path):
    """MetaSchedule times candidates at one size (its search stops with an internal error at a symbolic loop): a
    model with dynamic dims is refused before any work, naming the dims and ``--shape``; pinned, it tunes."""
    from tvm_fusion_ext.errors import FusionExtError
    from tvm_fusion_ext.tune.driver import TuneOptions, tune

    import tvm
    from tvm import relax

    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([n, 16], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, relax.const(np.ones((16, 8), "float32"))))
        bb.emit_func_output(out)
    mod = bb.get()
    mod["main"] = mod["main"].with_attr("onnx_input_names", ["x.in"])
    with pytest.raises(FusionExtError, match=r"dynamic input dims \(x\.in\[n,16\]\).*--shape x\.in:1x16") as err:
        tune(mod, "llvm", logs=str(tmp_path), workload="dyn", options=TuneOptions(trials=1))
    assert len(str(err.value).splitlines()) == 1
    assert not any(tmp_path.iterdir())
    from tvm_fusion_ext.tune.check_candidates import check_candidates

    with pytest.raises(FusionExtError, match=r"dynamic input dims .*--shape x\.in:1x16"):
        check_candidates(mod, "llvm", per_task=1)   # --build-only
