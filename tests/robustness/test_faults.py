"""Faults during tuning and writing: SIGKILL at random moments, builder timeouts, candidates that fail at run
time, an RPC server that goes away, interrupted writes. Builds on ``tests/tune/test_tuning.py`` (which kills
once and checks the database loads); here the run is killed several times and resumed to completion.

``FIGURES`` collects kills survived and records lost (printed by the last test; figures in README.md).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

ENCODER = dict(num_layers=1, hidden=32, heads=2, intermediate=64, seq=16)
TINY = dict(per_iter=2, population=16)
FIGURES = {"kills": 0, "records_before_kills": 0, "records_lost": 0}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    import onnx

    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.models import build_encoder_onnx

    path = str(tmp_path_factory.mktemp("model") / "tiny.onnx")
    onnx.save(build_encoder_onnx(**ENCODER), path)
    return path, load_onnx(path)


def _record_dir(root):
    (sub,) = [d for d in os.listdir(root) if d.startswith("tiny-")]
    return os.path.join(root, sub)


def _complete_lines(path):
    """Lines that were completely written (newline-terminated)."""
    if not os.path.exists(path):
        return []
    data = open(path, "rb").read()
    return [ln for ln in data.split(b"\n")[:-1] if ln.strip()]


def _records(path):
    from tvm_fusion_ext.records import open_database

    return open_database(path).get_all_tuning_records()


def _best_by_workload(path):
    import tvm_ffi

    best = {}
    for r in _records(path):
        secs = [float(s) for s in r.run_secs] if r.run_secs else []
        if not secs or min(secs) <= 0 or min(secs) >= 1e9:  # error placeholders
            continue
        key = int(tvm_ffi.structural_hash(r.workload.mod))
        best[key] = min(best.get(key, float("inf")), float(np.mean(secs)))
    return best


# ---------------------------------------------------------------------------------------------------------
# kill -9 several times, resume to completion
# ---------------------------------------------------------------------------------------------------------

TRIALS = 20
KILLS = 3


def _tune_cmd(model_path, logs, *extra):
    return [sys.executable, "-m", "tvm_fusion_ext.cli", "tune", model_path, "--trials", str(TRIALS),
            "--per-iter", str(TINY["per_iter"]), "--population", str(TINY["population"]), "--logs", str(logs),
            *extra]


@pytest.mark.slow
def test_sigkill_three_times_then_resume(model, tmp_path):
    """Criterion (robust on a shared 2-core machine, no timing comparison): after every kill each complete
    record line written before the kill is still in the database, which loads; the resumed run finishes
    (exit 0) with at least ``TRIALS`` records, the number an uninterrupted run with the same budget is asked
    to measure (a killed run can only add records: the manifest may lag the database by one batch, so a
    resume measures that batch's worth again, never less); and per workload the best latency in the final
    database is <= the best before any kill (a resume cannot lose a best: it only appends)."""
    from tvm_fusion_ext.records import RECORD_FILE, read_manifest

    rng = random.Random(1234)
    root = tmp_path / "logs"
    kept = []  # complete record lines seen after each kill
    best_before = {}
    for kill in range(KILLS):
        target_new = rng.randint(1, 2)
        have = len(kept)
        proc = subprocess.Popen(_tune_cmd(model[0], root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            deadline = time.time() + 180
            while time.time() < deadline and proc.poll() is None:
                dirs = list(root.glob("tiny-*")) if root.exists() else []
                if dirs and len(_complete_lines(dirs[0] / RECORD_FILE)) >= have + target_new:
                    break
                time.sleep(0.1)
            assert proc.poll() is None, f"kill {kill}: tuning ended (rc {proc.returncode}) before it was killed"
            # a random moment: mid-batch, mid-write or between batches (a resumed run's XGBModel is warm-started
            # and retrains less often, so its batches follow each other within a fraction of a second)
            time.sleep(rng.uniform(0.0, 0.3))
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        path = _record_dir(root)
        lines = _complete_lines(os.path.join(path, RECORD_FILE))
        records = _records(path)  # loads (cuts a partial last line if the kill hit a write)
        after = _complete_lines(os.path.join(path, RECORD_FILE))
        lost = [ln for ln in lines if ln not in after] + [ln for ln in kept if ln not in after]
        FIGURES["kills"] += 1
        FIGURES["records_lost"] += len(lost)
        assert not lost, f"kill {kill}: {len(lost)} complete records lost"
        assert len(records) == len(after) >= have
        kept = after
        FIGURES["records_before_kills"] = len(kept)
        for k, v in _best_by_workload(path).items():
            best_before[k] = min(best_before.get(k, float("inf")), v)
        assert read_manifest(path)["model_hash"]
    # resume to completion, no kill
    r = subprocess.run(_tune_cmd(model[0], root), capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    path = _record_dir(root)
    final = _complete_lines(os.path.join(path, RECORD_FILE))
    assert all(ln in final for ln in kept), "a record from before the kills is missing after the resume"
    assert len(_records(path)) == len(final) >= TRIALS
    # a kill in the middle of a line (forced here; above it depends on timing): the partial line is cut off
    # when the database is opened, everything before it loads
    with open(os.path.join(path, RECORD_FILE), "ab") as f:
        f.write(b'[0, [[[["GetSBlock",[],["dense"')
    assert len(_records(path)) == len(final)
    assert _complete_lines(os.path.join(path, RECORD_FILE)) == final
    manifest = read_manifest(path)
    assert manifest["trials"] >= TRIALS
    best_after = _best_by_workload(path)
    for k, v in best_before.items():
        assert best_after[k] <= v
    # asking again measures nothing new
    r2 = subprocess.run(_tune_cmd(model[0], root), capture_output=True, text=True, timeout=300)
    assert r2.returncode == 0 and "nothing to do" in r2.stdout
    assert _complete_lines(os.path.join(path, RECORD_FILE)) == final


# ---------------------------------------------------------------------------------------------------------
# failing candidates: builder timeouts, runner errors
# ---------------------------------------------------------------------------------------------------------

def _tune(mod, logs, trials, messages, **kw):
    from tvm_fusion_ext.tune.driver import TuneOptions, tune

    return tune(mod, "llvm", logs=str(logs), workload="tiny",
                options=TuneOptions(trials=trials, progress=messages.append, **{**TINY, **kw}))


@pytest.mark.slow
def test_builder_timeout_ends_cleanly_and_says_so(model, tmp_path):
    messages = []
    manifest = _tune(model[1], tmp_path, 2, messages, builder_timeout=1e-3)
    assert manifest["trials"] >= 2
    assert all(t["best_us"] is None for t in manifest["tasks"].values())  # nothing could be built in time
    assert sum(t.get("failed", 0) for t in manifest["tasks"].values()) >= 2
    text = "\n".join(messages)
    assert "failed" in text and "build" in text.lower() and "done" in text, text
    assert _records(_record_dir(tmp_path)) is not None  # database still loads


def _failing_runner_class():
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerResult

    @derived_object
    class _Failed(PyRunnerFuture):
        def done(self):
            return True

        def result(self):
            return RunnerResult(run_secs=None, error_msg="injected fault: candidate crashed at run time")

    @derived_object
    class FlakyRunner(PyRunner):
        """Every other candidate 'crashes' at run time; the rest are measured by a LocalRunner."""

        def __init__(self):
            super().__init__()
            self.inner = ms.runner.LocalRunner(evaluator_config=ms.runner.EvaluatorConfig(
                number=1, repeat=1, min_repeat_ms=0, enable_cpu_cache_flush=False))
            self.count = 0

        def run(self, runner_inputs):
            futures = []
            for inp in runner_inputs:
                self.count += 1
                futures.append(_Failed() if self.count % 2 == 0 else self.inner.run([inp])[0])
            return futures

    return FlakyRunner


@pytest.mark.slow
def test_runner_errors_do_not_stop_tuning(model, tmp_path):
    messages = []
    runner = _failing_runner_class()()
    manifest = _tune(model[1], tmp_path, 6, messages, runner=runner)
    assert runner.count >= 6 and manifest["trials"] >= 6
    tasks = manifest["tasks"].values()
    assert sum(t.get("failed", 0) for t in tasks) >= 3  # the injected half
    assert any(t["best_us"] is not None for t in tasks)  # the other half was measured and kept
    text = "\n".join(messages)
    assert "injected fault" in text and "done" in text, text
    path = _record_dir(tmp_path)
    ok = [r for r in _records(path) if r.run_secs and 0 < min(float(s) for s in r.run_secs) < 1e9]
    assert ok


# ---------------------------------------------------------------------------------------------------------
# RPC server goes away mid-run
# ---------------------------------------------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_rpc_server_goes_away_mid_run(model, tmp_path):
    from tvm_fusion_ext.records import RECORD_FILE, read_manifest

    port, server_port = _free_port(), _free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                               "--port", str(port), "--port-end", str(port + 1), "--silent"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)]
    tune_proc = None
    try:
        time.sleep(1.0)
        server = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1",
                                   "--port", str(server_port), "--port-end", str(server_port + 10),
                                   "--tracker", f"127.0.0.1:{port}", "--key", "tfx-fault", "--silent"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        procs.append(server)
        from tvm_fusion_ext.tune.remote import check_tracker

        deadline = time.time() + 60
        while True:
            try:
                check_tracker("127.0.0.1", port, "tfx-fault")
                break
            except Exception:  # noqa: BLE001  (not registered yet)
                assert time.time() < deadline, "RPC server never registered"
                time.sleep(0.5)
        root = tmp_path / "logs"
        log = open(tmp_path / "tune.log", "w")
        tune_proc = subprocess.Popen([sys.executable, "-m", "tvm_fusion_ext.cli", "tune", model[0], "--trials", "8",
                                      "--per-iter", "2", "--population", "16", "--logs", str(root),
                                      "--rpc", f"127.0.0.1:{port}", "--key", "tfx-fault"],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 180
        while time.time() < deadline and tune_proc.poll() is None:
            dirs = list(root.glob("tiny-*")) if root.exists() else []
            if dirs and len(_complete_lines(dirs[0] / RECORD_FILE)) >= 2:
                break
            time.sleep(0.1)
        assert tune_proc.poll() is None, "tuning ended before the server was killed"
        first_batch = _complete_lines(next(root.glob("tiny-*")) / RECORD_FILE)
        # measured on the RPC server through the tracker: real run times, not error placeholders
        secs = [json.loads(ln)[1][1] for ln in first_batch]
        assert all(s and 0 < min(float(x) for x in s) < 1e9 for s in secs), secs
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
        rc = tune_proc.wait(timeout=300)
        out = open(tmp_path / "tune.log").read()
        path = _record_dir(root)
        assert rc in (0, 2), out[-3000:]  # finished, or stopped with one clear error line: never a crash
        lines = _complete_lines(os.path.join(path, RECORD_FILE))
        assert all(ln in lines for ln in first_batch)  # what was measured before the server died is kept
        assert len(_records(path)) == len(lines)
        if rc == 0:
            manifest = read_manifest(path)
            assert sum(t.get("failed", 0) for t in manifest["tasks"].values()) >= 1
            assert "failed" in out, out[-3000:]
        else:
            assert out.strip().splitlines()[-1].startswith("error: "), out[-3000:]
    finally:
        for p in ([tune_proc] if tune_proc else []) + procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)


# ---------------------------------------------------------------------------------------------------------
# atomic writes
# ---------------------------------------------------------------------------------------------------------

def test_interrupted_atomic_write_leaves_old_file(tmp_path):
    from tvm_fusion_ext.fileio import atomic_write, atomic_write_bytes

    target = tmp_path / "out.npz"
    atomic_write_bytes(str(target), b"old contents")

    def half_then_crash(f):
        f.write(b"new contents, half wri")
        raise KeyboardInterrupt  # as if interrupted mid-write

    with pytest.raises(KeyboardInterrupt):
        atomic_write(str(target), half_then_crash, binary=True)
    assert target.read_bytes() == b"old contents"
    assert os.listdir(tmp_path) == ["out.npz"]  # temp file cleaned up


_WRITER = """
import os, sys, time
from tvm_fusion_ext.fileio import atomic_write
def slow(f):
    f.write(b"x" * 1000); f.flush(); os.fsync(f.fileno())
    open(sys.argv[2], "w").close()  # tell the parent we are mid-write
    time.sleep(60)
atomic_write(sys.argv[1], slow, binary=True)
"""


def test_sigkill_during_write_leaves_old_file(tmp_path):
    """A real kill -9 in the middle of a write (nothing can clean up): the old file is intact; only a
    ``.tmp-`` file is left behind, which no reader ever opens."""
    target, flag = tmp_path / "manifest.json", tmp_path / "flag"
    target.write_text(json.dumps({"trials": 4}))
    p = subprocess.Popen([sys.executable, "-c", _WRITER, str(target), str(flag)], start_new_session=True)
    try:
        deadline = time.time() + 60
        while not flag.exists():
            assert time.time() < deadline and p.poll() is None, "writer never started"
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGKILL)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    assert json.loads(target.read_text()) == {"trials": 4}
    leftovers = [n for n in os.listdir(tmp_path) if n not in ("manifest.json", "flag")]
    assert all(n.startswith(".tmp-") for n in leftovers)


def test_manifest_write_is_atomic(tmp_path, monkeypatch):
    """``tune.logs.write_manifest`` goes through the atomic writer: a failure while serialising leaves the
    previous manifest."""
    from tvm_fusion_ext import records as tlogs

    tlogs.write_manifest(str(tmp_path), {"trials": 3})
    before = (tmp_path / tlogs.MANIFEST_FILE).read_text()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        tlogs.write_manifest(str(tmp_path), {"trials": 5})
    monkeypatch.undo()
    assert (tmp_path / tlogs.MANIFEST_FILE).read_text() == before
    assert json.loads(before)["trials"] == 3
    assert os.listdir(tmp_path) == [tlogs.MANIFEST_FILE]


@pytest.mark.slow
def test_fault_figures():
    if not FIGURES["kills"]:
        pytest.skip("kill test not run in this session")
    sys.__stdout__.write(f"\n[faults] kills survived {FIGURES['kills']}, complete records before the last kill "
                         f"{FIGURES['records_before_kills']}, records lost {FIGURES['records_lost']}\n")
    assert FIGURES["records_lost"] == 0
