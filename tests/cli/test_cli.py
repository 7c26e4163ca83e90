"""The CLI contract: subcommand names, flags, JSON fields, one-line errors, no partial outputs."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tvm_fusion_ext.cli import main


def _cli(*args):
    """Run the real console entry point in a subprocess (as a user would)."""
    return subprocess.run([sys.executable, "-m", "tvm_fusion_ext.cli", *args], capture_output=True, text=True,
                          timeout=600)


def test_version_names_the_package_tvm_and_whether_it_compiles():
    import tvm
    import tvm_ffi

    import tvm_fusion_ext

    full = _cli("--version")
    assert full.returncode == 0 and full.stderr == ""
    line = full.stdout.strip()
    assert "\n" not in line and line.startswith(f"tvm-fusion {tvm_fusion_ext.__version__} ")
    assert f"TVM {tvm.__version__}, with its compiler" in line and f"tvm-ffi {tvm_ffi.__version__}" in line
    # a runtime-only TVM (how artifacts deploy) says so: it can run artifacts and compile nothing
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    runtime = subprocess.run([sys.executable, "-m", "tvm_fusion_ext.cli", "--version"], capture_output=True,
                             text=True, timeout=600, env=env)
    assert runtime.returncode == 0, runtime.stderr
    assert "runtime only" in runtime.stdout and "with its compiler" not in runtime.stdout


_COMPILING = {"compile": ["compile", "{model}", "-o", "{tmp}/art"], "fuse": ["fuse", "{model}"],
              "tune": ["tune", "{model}", "--trials", "2", "--logs", "{tmp}/logs"],
              "run-onnx": ["run", "{model}", "--inputs", "{tmp}/x.npz", "--output", "{tmp}/y.npz"],
              "bench-onnx": ["bench", "{model}", "--repeat", "1"]}


def _assert_names_missing_compiler(err, tmp_path):
    err = err.strip()
    assert "\n" not in err and err.startswith("error: "), err
    assert "libtvm_compiler.so" in err and "TVM_USE_RUNTIME_LIB=1" in err and "run|bench|info ARTIFACT" in err
    assert "internal error" not in err and "RegisterOpAttr" not in err
    assert not (tmp_path / "art").exists() and not (tmp_path / "y.npz").exists()


def test_compile_on_a_runtime_only_tvm_names_the_missing_compiler(tiny_encoder_path, tmp_path):
    """A runtime-only TVM fails deep inside TVM's importer (an AttributeError about RegisterOpAttr): the CLI says
    instead, in one line, that compiling needs libtvm_compiler.so and that artifacts run without it."""
    argv = [a.format(model=tiny_encoder_path, tmp=tmp_path) for a in _COMPILING["compile"]]
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    res = subprocess.run([sys.executable, "-m", "tvm_fusion_ext.cli", *argv], capture_output=True, text=True,
                         timeout=600, env=env)
    assert res.returncode == 2, res.stderr
    _assert_names_missing_compiler(res.stderr, tmp_path)


@pytest.mark.parametrize("command", sorted(_COMPILING))
def test_every_compiling_command_checks_for_the_compiler_first(command, tiny_encoder_path, tmp_path, monkeypatch,
                                                                 capsys):
    """The same check for each command that compiles (in process: the subprocess case above is the real thing);
    ``info`` and ``run`` on an artifact need no compiler and are not refused."""
    import tvm_fusion_ext.cli as cli

    np.savez(tmp_path / "x.npz", input_ids=np.zeros((1, 8), np.int64))
    monkeypatch.setenv("TVM_USE_RUNTIME_LIB", "1")
    monkeypatch.setattr(cli, "tvm_can_compile", lambda: False)
    assert main([a.format(model=tiny_encoder_path, tmp=tmp_path) for a in _COMPILING[command]]) == 2
    _assert_names_missing_compiler(capsys.readouterr().err, tmp_path)
    art = tmp_path / "art_dir"
    art.mkdir()
    (art / "manifest.json").write_text("{}")
    parsed = cli.build_parser().parse_args(["run", str(art), "--inputs", "x.npz", "--output", "y.npz"])
    assert cli.needs_compiler(parsed) is False
    assert cli.needs_compiler(cli.build_parser().parse_args(["info", str(art)])) is False


def test_fuse_json_contract(tiny_encoder_path, capsys):
    assert main(["fuse", tiny_encoder_path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["fused"]) >= {"dense", "attention", "layernorm", "qkv"}
    layers = 2  # build_encoder_onnx default
    assert report["fused"]["attention"] == layers
    assert report["fused"]["qkv"] == layers
    assert report["fused"]["layernorm"] >= 2 * layers
    assert isinstance(report["refused"], list)


def test_fuse_json_reports_padding_removed(tiny_encoder_path, capsys):
    assert main(["fuse", tiny_encoder_path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["padding_removed"] == 0  # off by default
    assert main(["fuse", tiny_encoder_path, "--json", "--remove-padding"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["padding_removed"] == 1
    assert report["varlen_attention"] == report["fused"]["attention"]  # every attention runs packed
    assert [e["rule"] for e in report["applied"]].count("RemovePadding") == 1


def test_fuse_text_report(tiny_encoder_path, capsys):
    assert main(["fuse", tiny_encoder_path]) == 0
    out = capsys.readouterr().out
    assert "attention" in out and "Near misses" in out


def test_run_matches_onnxruntime(tiny_encoder_path, tmp_path, run_ort):
    from tvm_fusion_ext.models import sample_inputs

    feeds = sample_inputs(tiny_encoder_path, seed=3)
    inputs = tmp_path / "x.npz"
    np.savez(inputs, **feeds)
    for extra in ([], ["--no-fusion"]):
        out = tmp_path / f"y{len(extra)}.npz"
        assert main(["run", tiny_encoder_path, "--inputs", str(inputs), "--output", str(out), *extra]) == 0
        got = np.load(out)
        ref = run_ort(tiny_encoder_path, feeds)[0]
        np.testing.assert_allclose(got["last_hidden_state"], ref, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # 21 s: compile + run; RemovePadding and artifacts each have default-tier tests
def test_compile_and_run_padding_free_artifact(tiny_encoder_path, tmp_path, run_ort):
    """compile --remove-padding: the artifact records it and matches ORT at valid positions, zeros elsewhere."""
    from tvm_fusion_ext.deploy import load
    from tvm_fusion_ext.models import sample_inputs

    feeds = sample_inputs(tiny_encoder_path, seed=4)
    feeds["attention_mask"][:, 5:] = 0
    inputs, out, art = tmp_path / "x.npz", tmp_path / "y.npz", tmp_path / "art"
    np.savez(inputs, **feeds)
    assert main(["compile", tiny_encoder_path, "-o", str(art), "--remove-padding"]) == 0
    assert load(str(art)).manifest["fusion"]["padding_removed"] == 1
    assert main(["run", str(art), "--inputs", str(inputs), "--output", str(out)]) == 0
    got = np.load(out)["last_hidden_state"]
    ref = run_ort(tiny_encoder_path, feeds)[0]
    valid = feeds["attention_mask"].astype(bool)
    np.testing.assert_allclose(got[valid], ref[valid], rtol=1e-4, atol=1e-4)
    assert np.all(got[~valid] == 0.0)


@pytest.mark.parametrize("case", ["missing_model", "not_onnx", "bad_input_name", "bad_shape", "bad_target"])
def test_errors_are_one_line_and_leave_no_output(case, tiny_encoder_path, tmp_path):
    from tvm_fusion_ext.models import sample_inputs

    feeds = sample_inputs(tiny_encoder_path)
    model, target = tiny_encoder_path, "llvm"
    if case == "missing_model":
        model = str(tmp_path / "nope.onnx")
    elif case == "not_onnx":
        model = str(tmp_path / "junk.onnx")
        with open(model, "wb") as f:
            f.write(b"this is not a protobuf" * 10)
    elif case == "bad_input_name":
        feeds = {("wrong_" + k if i == 0 else k): v for i, (k, v) in enumerate(feeds.items())}
    elif case == "bad_shape":
        feeds = {k: np.concatenate([v, v], axis=-1) for k, v in feeds.items()}
    elif case == "bad_target":
        target = "tpu"
    inputs = tmp_path / "x.npz"
    np.savez(inputs, **feeds)
    out = tmp_path / "y.npz"
    r = _cli("run", model, "--inputs", str(inputs), "--output", str(out), "--target", target)
    assert r.returncode == 2, r.stderr
    lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    expected = {"missing_model": "nope.onnx", "not_onnx": "junk.onnx", "bad_input_name": "wrong_",
                "bad_shape": "shape", "bad_target": "tpu"}[case]
    assert expected in lines[0]
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]
