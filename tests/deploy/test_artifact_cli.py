"""``tvm-fusion compile``, and ``run`` / ``bench`` on artifacts: what they print and write, exit codes, and no
partial artifact after a failed compile."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tvm_fusion_ext.cli import main
from tvm_fusion_ext.deploy import load


def _refused(capsys, args, *needles):
    """``tvm-fusion ARGS`` (in this process: the same entry point) exits 2 with one line naming the problem."""
    capsys.readouterr()
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_compile_prints_what_it_wrote_and_run_uses_it(tiny_onnx, tiny_artifact, tmp_path, capsys):
    from tvm_fusion_ext.models import sample_inputs

    out = tmp_path / "tiny"
    assert main(["compile", tiny_onnx, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    manifest = load(str(out)).manifest
    assert f"wrote {out}/" in printed
    for name in ("model.so", "weights.bin", "manifest.json"):
        assert name in printed
    fused_line = next(ln for ln in printed.splitlines() if ln.strip().startswith("fused"))
    assert all(f"{k} {v}" in fused_line for k, v in manifest["fusion"]["fused"].items())
    assert "no tuning records given" in printed
    assert "input  input_ids: int64[1, 32]" in printed

    feeds = sample_inputs(tiny_onnx, seed=4)
    np.savez(tmp_path / "x.npz", **feeds)
    assert main(["run", str(out), "--inputs", str(tmp_path / "x.npz"), "--output", str(tmp_path / "y.npz")]) == 0
    with np.load(tmp_path / "y.npz") as got:  # the session's artifact of the same file (the API's compile)
        np.testing.assert_array_equal(got["last_hidden_state"], load(tiny_artifact).run(feeds)["last_hidden_state"])


def test_bench_an_artifact_against_ort_and_the_in_process_build(tiny_artifact, tmp_path, capsys):
    out_json = tmp_path / "b.json"
    assert main(["bench", tiny_artifact, "--against", "ort,build", "--repeat", "3", "--json", str(out_json)]) == 0
    printed = capsys.readouterr().out
    r = json.loads(out_json.read_text())
    assert r["mode"] == "artifact" and r["onnx"] is not None  # the recorded source was found, unchanged
    rows = {x["name"]: x for x in r["runtimes"]}
    ours, ort, inproc = rows["tvm_fusion_ext"], rows["onnxruntime"], rows["tvm_fusion_ext in-process"]
    assert r["ratio_vs_ort"] == pytest.approx(ours["median_ms"] / ort["median_ms"], rel=1e-12)
    assert r["max_abs_diff_vs_ort"] == ours["max_abs_diff"] < 1e-4
    assert inproc["max_abs_diff"] == ours["max_abs_diff"]  # same kernels, same numbers
    assert 0 < r["load_seconds"] == ours["load_seconds"]
    assert r["fused"] == load(tiny_artifact).manifest["fusion"]["fused"]
    assert r["input_shapes"] == {"input_ids": [1, 32], "attention_mask": [1, 32]}
    assert "loaded" in printed and "tvm_fusion_ext in-process" in printed
    assert r["kernels"] is None and r["ort_kernels"] is None  # asked for with --kernels only


def test_bench_an_artifact_kernel_by_kernel(tiny_artifact, tmp_path, capsys):
    out_json = tmp_path / "k.json"
    assert main(["bench", tiny_artifact, "--against", "ort", "--repeat", "2", "--kernels", "--json",
                 str(out_json)]) == 0
    printed = capsys.readouterr().out
    r = json.loads(out_json.read_text())
    names = [k["name"] for k in r["kernels"]["kernels"]]
    assert sum(k["calls"] for k in r["kernels"]["kernels"] if k["name"].startswith("fused_attention")) == \
        r["fused"]["attention"]
    assert names[0] in printed and "un-instrumented call" in printed
    assert r["ort_kernels"]["runs"] == 2 and r["ort_kernels"]["ops"][0]["op"] in printed


def test_bench_without_the_onnx_source(symbolic_artifact, tmp_path, capsys):
    """A hand-built module has no ONNX source: the artifact is still timed, at the requested size, and the
    peers say why they did not run."""
    out_json = tmp_path / "b.json"
    assert main(["bench", symbolic_artifact[0], "--batch", "12", "--repeat", "2", "--json", str(out_json)]) == 0
    printed = capsys.readouterr().out
    assert "ONNX Runtime not run: no ONNX source recorded" in printed
    r = json.loads(out_json.read_text())
    assert r["input_shapes"] == {"x.in": [12, 16], "y": [12, 16]}
    rows = {x["name"]: x for x in r["runtimes"]}
    assert rows["tvm_fusion_ext"]["available"] and r["ratio_vs_ort"] is None
    assert not rows["onnxruntime"]["available"] and "no ONNX source recorded" in rows["onnxruntime"]["note"]
    _refused(capsys, ["bench", symbolic_artifact[0], "--seq", "7"], "static dim 1 = 16", "--seq 7")


def test_bench_symbolic_dim_within_bounds_only(symbolic_artifact, capsys):
    _refused(capsys, ["bench", symbolic_artifact[0], "--batch", "65", "--repeat", "1"],
             "dim 0 (n) is 65, outside the range the model was compiled for (1..64)")


def test_compile_errors_leave_no_artifact(tmp_path, tiny_onnx, capsys):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a protobuf" * 10)
    out = str(tmp_path / "out")
    _refused(capsys, ["compile", str(junk), "-o", out], "junk.onnx")
    _refused(capsys, ["compile", tiny_onnx, "-o", out, "--target", "llvm:no-such-cpu"], "unknown LLVM CPU 'no-such-cpu'")
    _refused(capsys, ["compile", tiny_onnx, "-o", out, "--shape", "input_ids:2x32"], "input_ids")
    assert sorted(os.listdir(tmp_path)) == ["junk.onnx"]  # no artifact, no temporary directory
    (tmp_path / "taken").write_text("a file")
    _refused(capsys, ["compile", tiny_onnx, "-o", str(tmp_path / "taken")], "is a file")
    assert (tmp_path / "taken").read_text() == "a file"


@pytest.mark.parametrize("flag", [["--target", "cuda"], ["--no-fusion"], ["--shape", "input_ids:1x32"],
                                  ["--max-shape", "input_ids:1x32"]])
def test_run_refuses_compile_flags_for_an_artifact(flag, symbolic_artifact, tmp_path, capsys):
    from _artifacts import symbolic_feeds

    np.savez(tmp_path / "x.npz", **symbolic_feeds(2))
    _refused(capsys, ["run", symbolic_artifact[0], "--inputs", str(tmp_path / "x.npz"), "--output",
                      str(tmp_path / "y.npz"), *flag], flag[0], "applies when compiling")
    assert not (tmp_path / "y.npz").exists()
