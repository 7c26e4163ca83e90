"""The GPU campaign without a GPU: its build side with nvcc (sm_80), and its run side rehearsed on this CPU (the same
campaign built for llvm, run by a process whose TVM is runtime-only), so that the first GPU run is not the first
run of this code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tvm_fusion_ext.tools.gpu_campaign.__main__ import main

REPO = Path(__file__).resolve().parents[2]


def _run_runtime_only(campaign: Path, out: Path, *extra):
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", PYTHONPATH=str(REPO))
    code = ("import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_module('tvm_fusion_ext.tools.gpu_campaign', "
            "run_name='__main__')\n")
    probe = ("import sys, atexit, json\n"
             "atexit.register(lambda: print('HEAVY', json.dumps(sorted(m for m in sys.modules if m.startswith("
             "('tvm.relax', 'tvm.s_tir', 'tvm_fusion_ext.compile', 'tvm_fusion_ext.schedules'))))))\n")
    return subprocess.run([sys.executable, "-c", probe + code, "gpu_campaign", "run", str(campaign), "--json",
                           str(out), *extra], capture_output=True, text=True, env=env, cwd=REPO, timeout=600)


def test_speed_parts_built_for_the_cpu_run_with_the_runtime_only(tmp_path):
    pytest.importorskip("torch", reason="torch is the peer the campaign times against")
    campaign = tmp_path / "campaign"
    assert main(["build", str(campaign), "--arch", "llvm", "--parts", "dense,norms", "--quick"]) == 0
    manifest = json.loads((campaign / "campaign.json").read_text())
    assert set(manifest["parts"]) == {"dense", "norms"} and all(p["expected_s"] > 0 for p in manifest["parts"].values())
    done = _run_runtime_only(campaign, tmp_path / "out.json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    heavy = json.loads(done.stdout.split("HEAVY ", 1)[1].splitlines()[0])
    assert heavy == [], heavy  # the run side imports nothing that compiles
    results = json.loads((tmp_path / "out.json").read_text())
    rows = [r for part in results["parts"].values() for r in part["cases"]]
    assert len(rows) == 3 and all("error" not in r for r in rows), rows
    assert all(r["ours_s"] > 0 and r["torch_s"] > 0 and r["max_abs_vs_torch"] < 0.05 for r in rows), rows
    assert "ours/torch" in done.stdout and "expected" in done.stdout  # the table and the expected times


def test_run_of_a_part_not_built_or_of_no_campaign_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no campaign.json"):
        main(["run", str(tmp_path)])
    with pytest.raises(SystemExit, match="unknown part"):
        main(["build", str(tmp_path), "--arch", "llvm", "--parts", "dense,tuning"])


@pytest.mark.slow
def test_numerics_part_built_for_the_cpu_passes_with_the_runtime_only(tmp_path):
    pytest.importorskip("torch", reason="torch is the peer the campaign times against")
    campaign = tmp_path / "campaign"
    assert main(["build", str(campaign), "--arch", "llvm", "--parts", "numerics"]) == 0
    done = _run_runtime_only(campaign, tmp_path / "out.json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    numerics = json.loads((tmp_path / "out.json").read_text())["parts"]["numerics"]
    assert numerics["failed"] == 0 and numerics["passed"] >= 10


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_built_with_nvcc_for_sm_80(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")
    campaign = tmp_path / "campaign"
    assert main(["build", str(campaign), "--arch", "sm_80", "--parts", "norms,attention", "--quick"]) == 0
    cases = json.loads((campaign / "norms" / "cases.json").read_text())["cases"]
    assert len(cases) == 2 and all((campaign / "norms" / c["library"]).stat().st_size > 0 for c in cases)
    assert (campaign / "attention" / "attention_f16_S128_D64_H2_causal.so").is_file()
    size = sum(f.stat().st_size for f in campaign.rglob("*") if f.is_file())
    assert size < 8 * 2**20  # small libraries: the whole campaign and the 23 MB runtime fit the 64 MiB carried
