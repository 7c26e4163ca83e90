"""``tvm-fusion info`` / ``deploy.describe``: what an artifact takes, and whether this machine can load it, without
loading it; every reason ``load`` would refuse it for, each one line; runtime-only."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _artifacts import SYMBOLIC_BOUND, flip_a_byte, reseal

from tvm_fusion_ext.cli import main
from tvm_fusion_ext.deploy import load
from tvm_fusion_ext.deploy.describe import describe, format_description
from tvm_fusion_ext.deploy.manifest import LIBRARY_FILE, WEIGHTS_FILE
from tvm_fusion_ext.errors import ArtifactError


def test_describes_inputs_bounds_and_target_of_a_loadable_artifact(symbolic_artifact, no_library_loads):
    path = symbolic_artifact[0]
    info = describe(path)
    manifest = json.load(open(os.path.join(path, "manifest.json")))
    assert info["here"] == {**info["here"], "loadable": True, "problems": [], "sha256_checked": True}
    assert info["inputs"] == manifest["inputs"] and info["outputs"] == manifest["outputs"]
    assert info["dims"]["n"]["max"] == SYMBOLIC_BOUND
    assert info["files"] == {name: entry["bytes"] for name, entry in manifest["files"].items()}
    assert info["weights"]["tensors"] == len(manifest["weights"]) >= 1
    text = format_description(info)
    for spec in manifest["inputs"] + manifest["outputs"]:
        assert spec["name"] in text
    assert f"n: 1 .. {SYMBOLIC_BOUND}" in text and "loadable (checked" in text


def test_every_reason_is_listed_and_the_cli_exits_2_with_the_first(symbolic_artifact, copy_artifact, capsys,
                                                                   no_library_loads):
    path = copy_artifact(symbolic_artifact[0])
    reseal(path, lambda m: m["producer"].update(tvm="0.26.0"))
    with open(os.path.join(path, WEIGHTS_FILE), "r+b") as f:
        f.truncate(8)
    info = describe(path)
    problems = info["here"]["problems"]
    assert not info["here"]["loadable"] and len(problems) == 2, problems
    assert "TVM 0.26.0" in problems[0] and WEIGHTS_FILE in problems[1] and "truncated" in problems[1]
    assert all("\n" not in p and path in p for p in problems)
    # the loader refuses with the first of them, word for word
    with pytest.raises(ArtifactError) as refused:
        load(path)
    assert str(refused.value) == problems[0]

    assert main(["info", path]) == 2
    out, err = capsys.readouterr()
    assert "NOT loadable" in out and problems[1] in out
    assert err == f"error: {problems[0]}\n"


def test_no_verify_checks_sizes_only(symbolic_artifact, copy_artifact, no_library_loads):
    path = copy_artifact(symbolic_artifact[0])
    flip_a_byte(path, LIBRARY_FILE)
    assert describe(path, verify=False)["here"]["loadable"]
    problems = describe(path)["here"]["problems"]
    assert len(problems) == 1 and "sha256 mismatch" in problems[0] and LIBRARY_FILE in problems[0]


def test_json_and_what_is_not_an_artifact(symbolic_artifact, tmp_path, capsys):
    assert main(["info", symbolic_artifact[0], "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert set(info) >= {"inputs", "outputs", "dims", "target", "producer", "fused", "records", "files", "here"}
    assert main(["info", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "manifest.json" in err and str(tmp_path) in err


def test_runs_where_tvm_is_runtime_only(tiny_artifact):
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    code = ("import sys, json, tvm_ffi\n"
            "assert tvm_ffi.get_global_func('target.build.llvm', allow_missing=True) is None  # no compiler\n"
            "from tvm_fusion_ext.cli import main\n"
            "rc = main(['info', sys.argv[1], '--json'])\n"
            "assert not [m for m in sys.modules if m.startswith(('tvm_fusion_ext.compile', 'tvm.relax'))]\n"
            "sys.exit(rc)\n")
    done = subprocess.run([sys.executable, "-c", code, tiny_artifact], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["here"]["loadable"] and info["fused"]["attention"] == 2


def test_a_cuda_artifact_without_a_gpu_is_not_loadable_here(symbolic_artifact, copy_artifact, no_library_loads):
    import tvm

    if tvm.cuda(0).exist:
        pytest.skip("a GPU is present: the refusal is for machines without one")
    path = copy_artifact(symbolic_artifact[0])
    reseal(path, lambda m: m["target"].update(family="cuda", arch="sm_80"))  # what describe reads of a CUDA build
    problems = describe(path)["here"]["problems"]
    assert len(problems) == 1 and "CUDA sm_80" in problems[0] and "no CUDA GPU" in problems[0]
