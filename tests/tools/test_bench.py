"""``tvm-fusion bench``: the JSON contract, numerics against ONNX Runtime / numpy, the workspace measurement
(checked on a PrimFunc whose allocations we know) and the one-line errors. No timing assertions."""

import json

import numpy as np
import pytest
import tvm
from tvm import te

from tvm_fusion_ext.tools.bench import tir_allocation_bytes, hf_export_info
from tvm_fusion_ext.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    for n in needles:
        assert n in err, err
    return err


def test_model_bench_writes_contract_json_and_png(tiny_encoder_path, tmp_path, capsys):
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    assert main(["bench", tiny_encoder_path, "--against", "ort,torch,tvm", "--repeat", "3", "--kernels",
                 "--json", str(out_json), "--plot", str(out_png)]) == 0
    printed = capsys.readouterr().out
    r = json.loads(out_json.read_text())

    by_name = {x["name"]: x for x in r["runtimes"]}
    ours, ort, stock = by_name["tvm_fusion_ext"], by_name["onnxruntime"], by_name["tvm (stock tvm.compile)"]
    assert r["ratio_vs_ort"] == pytest.approx(ours["median_ms"] / ort["median_ms"], rel=1e-12)
    assert ours["ratio_vs_ort"] == pytest.approx(r["ratio_vs_ort"], rel=1e-12)
    for row in (ours, ort, stock):
        assert row["available"] and 1 <= row["runs"] <= 3
        assert row["p10_ms"] <= row["median_ms"] <= row["p90_ms"]
    assert ours["max_abs_diff"] < 1e-4 and stock["max_abs_diff"] < 1e-4
    assert r["max_abs_diff_vs_ort"] == ours["max_abs_diff"]
    assert r["threading"]["thread_spinning"] is False  # the default: no busy-waiting workers, for all runtimes
    # the tiny encoder is not a transformers export: no torch module to time, and the table says so
    assert not by_name["torch"]["available"] and "not a transformers export" in by_name["torch"]["note"]
    assert "n/a (not a transformers export)" in printed
    # stock TVM's unchecked-Gather warning (C++, straight to fd 2) is replaced by one line that says what it means
    from tvm_fusion_ext.tools.bench.peers import FAST_GATHER_NOTE
    assert printed.count(FAST_GATHER_NOTE) == 1
    # fusion counts are those of `tvm-fusion fuse --json` on the same file
    assert main(["fuse", tiny_encoder_path, "--json"]) == 0
    assert r["fused"] == json.loads(capsys.readouterr().out)["fused"]
    assert r["fused"]["attention"] >= 1
    assert out_png.read_bytes()[:8] == PNG_MAGIC
    # --kernels: our build's call, kernel by kernel (deploy.profile_kernels); one launch per fused operator
    kernels = {k["name"]: k for k in r["kernels"]["kernels"]}
    assert sum(k["calls"] for n, k in kernels.items() if n.startswith("fused_dense")) == r["fused"]["dense"]
    assert sum(k["calls"] for n, k in kernels.items() if n.startswith("fused_attention")) == r["fused"]["attention"]
    assert r["kernels"]["runs"] == 3 and "where our call's time goes" in printed
    peaks = r["kernels"]["peaks"]  # the host's peak per precision, measured in the same run (or why not)
    assert r["kernels"]["precision"] == "fp32" and ("fp32_gflops" in peaks or "error" in peaks)
    assert "host peaks" in printed
    # and ONNX Runtime's call, split by its own profiler (tools/bench/ort_profile.py): the same number of calls
    ort_ops = {o["op"]: o for o in r["ort_kernels"]["ops"]}
    assert r["ort_kernels"]["runs"] == 3 and "MatMul" in ort_ops and "where ONNX Runtime's call goes" in printed


def test_captured_stderr_takes_what_native_code_writes_to_fd_2():
    import os

    from tvm_fusion_ext.deploy.native_log import captured_stderr

    with captured_stderr() as lines:
        os.write(2, b"[01:02:03] transform.h:1261: Warning: Fast mode segfaults when there are out-of-bounds indices\n")
        os.write(2, b"something else\n")
        assert lines == []  # filled when the block ends
    assert lines == ["[01:02:03] transform.h:1261: Warning: Fast mode segfaults when there are out-of-bounds indices",
                     "something else"]


def _model_result(stock_ms=1994.5):
    rows = [("tvm_fusion_ext", 15.12), ("onnxruntime", 20.83), ("torch", 23.82), ("tvm (stock tvm.compile)", stock_ms)]
    return {"mode": "model", "model": "m", "batch": 1, "seq": 128,
            "environment": {"cpu": "AMD EPYC 9R14", "cpus": 2, "date": "2026-11-29"},
            "runtimes": [{"name": n, "median_ms": m, "p10_ms": 0.98 * m, "p90_ms": 1.05 * m} for n, m in rows]}


def test_plot_is_linear_from_zero_with_host_and_date():
    """Bar heights compare as the times do (a log axis starting at 14.5 ms made 14.6 vs 19.9 ms look like 1:6);
    a runtime over OFF_SCALE_RATIO times the fastest is clipped with its figure written on it."""
    import matplotlib.pyplot as plt

    from tvm_fusion_ext.tools.bench.report import OFF_SCALE_RATIO, figure

    fig = figure(_model_result())
    try:
        (ax,) = fig.axes
        assert ax.get_yscale() == "linear"
        low, high = ax.get_ylim()
        assert low == 0 and 23.82 * 1.05 <= high <= 15.12 * OFF_SCALE_RATIO
        title = ax.get_title()
        assert "AMD EPYC 9R14" in title and "2 cores" in title and "2026-11-29" in title
        texts = [t.get_text() for t in ax.texts]
        assert any("0.73x ORT" in t for t in texts) and any("1994 ms" in t and "off scale" in t for t in texts)
        # the tick labels are plain numbers, not powers of ten
        fig.canvas.draw()
        assert all("times" not in t.get_text() and "^" not in t.get_text() for t in ax.get_yticklabels())
    finally:
        plt.close(fig)
    # with every runtime on scale, nothing is clipped
    fig = figure(_model_result(stock_ms=30.0))
    try:
        assert fig.axes[0].get_ylim()[1] >= 30.0 * 1.05 and not any("off scale" in t.get_text()
                                                                      for t in fig.axes[0].texts)
    finally:
        plt.close(fig)


def test_workspace_of_a_known_primfunc():
    # B is an intermediate stage of 16x8 float32 (512 bytes); A and C are parameters, not workspace
    a = te.placeholder((16, 8), "float32", name="A")
    b = te.compute((16, 8), lambda i, j: a[i, j] * 2.0, name="B")
    c = te.compute((16, 8), lambda i, j: b[i, j] + 1.0, name="C")
    assert tir_allocation_bytes(te.create_prim_func([a, c])) == [512]
    h = te.placeholder((4, 4), "float16", name="H")
    assert tir_allocation_bytes(te.create_prim_func([h, te.compute((4, 4), lambda i, j: h[i, j], name="O")])) == []


def test_attention_only_workspace_linear_vs_quadratic(tmp_path, capsys):
    out_json, out_png = tmp_path / "a.json", tmp_path / "a.png"
    heads, seqs = 2, (64, 256)
    assert main(["bench", "--attention-only", "--seq", ",".join(map(str, seqs)), "--heads", str(heads),
                 "--head-dim", "32", "--repeat", "2", "--json", str(out_json), "--plot", str(out_png)]) == 0
    r = json.loads(out_json.read_text())
    assert [e["seq"] for e in r["results"]] == list(seqs)
    ws = {name: [] for name in ("tvm_fusion_ext", "unfused relax")}
    for e in r["results"]:
        score_bytes = heads * e["seq"] ** 2 * 4
        rows = {x["name"]: x for x in e["runtimes"]}
        for name in ws:
            assert rows[name]["max_abs_diff"] < 1e-4  # against a float64 numpy softmax(qkᵀ/√d)·v
            ws[name].append(rows[name]["workspace_bytes"])
        assert rows["unfused relax"]["workspace_bytes"] >= score_bytes  # the S×T scores are materialised
        if e["seq"] >= 256:  # below that the fixed per-tile buffers outweigh a small S×T matrix
            assert rows["tvm_fusion_ext"]["workspace_bytes"] < score_bytes
        assert rows["torch sdpa"]["max_abs_diff"] < 1e-4
        assert rows["torch sdpa"]["workspace_bytes"] is None  # not measured, and the JSON says so
    growth = seqs[1] / seqs[0]
    assert ws["tvm_fusion_ext"][1] <= 1.1 * growth * ws["tvm_fusion_ext"][0]  # ~linear
    assert ws["unfused relax"][1] >= 0.75 * growth ** 2 * ws["unfused relax"][0]  # ~quadratic
    assert out_png.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize("against,needle", [("ort,cudnn", "cudnn"), ("", "--against")])
def test_bad_against_is_one_line_error(tiny_encoder_path, tmp_path, capsys, against, needle):
    out_json = tmp_path / "x.json"
    assert main(["bench", tiny_encoder_path, "--against", against, "--json", str(out_json)]) == 2
    _one_line_error(capsys, needle)
    assert not out_json.exists()


@pytest.mark.parametrize("argv,needle", [
    (["--seq", "64"], "--seq 64"),  # the tiny encoder is static (seq 32) and not one of our exports
    (["--target", "cuda"], "no GPU"),
])
def test_model_mode_errors(tiny_encoder_path, capsys, argv, needle):
    if "cuda" in argv and tvm.cuda(0).exist:
        pytest.skip("a GPU is present")
    assert main(["bench", tiny_encoder_path, *argv]) == 2
    _one_line_error(capsys, needle)


@pytest.mark.parametrize("argv", [["--attention-only", "--seq", "64,x"], ["--attention-only", "--seq", "0"],
                                  ["--dense", "16x16x16", "--kernels"], ["--attention-only", "--kernels"],
                                  ["--seq", "128"], ["--lengths", "16"], ["--lengths", "9-3"],
                                  ["--lengths", "0-4"]])
def test_argument_errors(capsys, argv):
    assert main(["bench", *argv]) == 2
    _one_line_error(capsys)


@pytest.mark.slow
def test_transformers_export_is_timed_with_torch(minilm_export, tmp_path, capsys):
    path = minilm_export("legacy", "sdpa", seq=16, num_layers=1)
    assert hf_export_info(path)["kind"] == "minilm"
    out_json = tmp_path / "m.json"
    assert main(["bench", path, "--against", "ort,torch", "--repeat", "2", "--json", str(out_json)]) == 0
    rows = {x["name"]: x for x in json.loads(out_json.read_text())["runtimes"]}
    assert rows["torch"]["available"]
    # torch eager and our build, each against ORT on the same inputs: all three agree
    assert rows["torch"]["max_abs_diff"] < 1e-4 and rows["tvm_fusion_ext"]["max_abs_diff"] < 1e-4
    assert np.isfinite(rows["torch"]["median_ms"])


def test_dense_mode_reports_gflops_and_checks_numpy(tmp_path):
    from tvm_fusion_ext.cli import main

    out = tmp_path / "dense.json"
    assert main(["bench", "--dense", "16x40x24", "--act", "relu", "--repeat", "3", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["mode"] == "dense" and result["shape"] == [16, 40, 24]
    assert result["max_abs_diff"] < 1e-4
    assert result["gflops"] == pytest.approx(2 * 16 * 40 * 24 / (result["median_ms"] * 1e-3) / 1e9)
    assert main(["bench", "--dense", "16x0x24"]) == 2


def test_drawn_lengths_are_seeded_and_in_range():
    from tvm_fusion_ext.tools.bench.lengths import apply_lengths, draw_lengths

    drawn = draw_lengths((16, 128), 8, seed=0)
    assert drawn == [int(n) for n in np.random.default_rng(0).integers(16, 129, size=8)]
    assert all(16 <= n <= 128 for n in drawn) and drawn != draw_lengths((16, 128), 8, seed=1)
    feeds = apply_lengths({"attention_mask": np.ones((2, 5), np.int64), "input_ids": np.zeros((2, 5), np.int64)},
                          [5, 2], "m")
    assert feeds["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]


@pytest.mark.slow
def test_variable_length_batch_padding_free(minilm_export, tmp_path, capsys):
    """--lengths: every runtime gets the same padded batch; ours padding-free agrees at valid positions."""
    from tvm_fusion_ext.tools.bench.lengths import draw_lengths

    path = minilm_export("legacy", "sdpa", seq=16, num_layers=1)
    out_json = tmp_path / "v.json"
    assert main(["bench", path, "--batch", "4", "--lengths", "3-16", "--seed", "5", "--remove-padding",
                 "--against", "ort,torch", "--repeat", "2", "--json", str(out_json)]) == 0
    r = json.loads(out_json.read_text())
    drawn = draw_lengths((3, 16), 4, seed=5)
    assert r["lengths"] == drawn and r["batch"] == 4 and r["seq"] == max(drawn)
    assert r["input_shapes"]["attention_mask"] == [4, max(drawn)]
    assert r["padding_removed"] == 1 and r["max_abs_diff_at"] == "valid positions"
    rows = {x["name"]: x for x in r["runtimes"]}
    assert rows["tvm_fusion_ext"]["max_abs_diff"] < 1e-4 and rows["torch"]["max_abs_diff"] < 1e-4
    # our padded build is timed in the same run, as the baseline of what removing the padding gains
    assert rows["tvm_fusion_ext (padded)"]["max_abs_diff"] < 1e-4
    assert r["ratio_vs_ort"] is not None and r["ratio_vs_padded"] == pytest.approx(
        rows["tvm_fusion_ext"]["median_ms"] / rows["tvm_fusion_ext (padded)"]["median_ms"], rel=1e-12)


def test_gated_mode_times_the_fused_kernel_against_the_pipeline_without_it_and_torch(tmp_path):
    from tvm_fusion_ext.cli import main

    out = tmp_path / "gated.json"
    assert main(["bench", "--gated", "12x32x40", "--repeat", "3", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["mode"] == "gated" and result["shape"] == [12, 32, 40]
    assert [r["runtime"] for r in result["results"]] == ["fused_gated_dense", "without FuseGatedMLP", "torch eager"]
    assert all(r["max_abs_diff"] < 1e-4 and np.isfinite(r["median_ms"]) for r in result["results"])
    assert main(["bench", "--gated", "12x32"]) == 2


def _cache_like_model(tmp_path):
    """``y = x + past·2`` with ``past`` [batch, heads, past_len, 4]: a dim that is neither batch nor sequence,
    which bench cannot invent (a KV-cache decoder's ``past_key_values``) and ``--inputs`` gives."""
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper

    nodes = [helper.make_node("ReduceSum", ["past", "axes"], ["s"], keepdims=0),
             helper.make_node("Mul", ["s", "two"], ["s2"]),
             helper.make_node("Add", ["x", "s2"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 2, 4]),
                     helper.make_tensor_value_info("past", TP.FLOAT, ["batch", 2, "past_len", 4])],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array([2], np.int64), "axes"),
         onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    path = tmp_path / "cache_like.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    rng = np.random.default_rng(0)
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=rng.standard_normal((3, 2, 4)).astype("float32"),
             past=rng.standard_normal((3, 2, 7, 4)).astype("float32"))
    return str(path), str(inputs)


def test_inputs_from_a_file_model_and_artifact(tmp_path, capsys):
    """``--inputs X.npz``: times on the given arrays (shapes from them), checked against ONNX Runtime, for an ONNX
    file and for an artifact; without it the past length cannot be made up (one-line error)."""
    from tvm_fusion_ext.compile import compile_artifact

    path, inputs = _cache_like_model(tmp_path)
    assert main(["bench", path]) == 2
    _one_line_error(capsys, "'past'", "beyond batch and sequence")
    out_json = tmp_path / "r.json"
    assert main(["bench", path, "--inputs", inputs, "--against", "ort", "--repeat", "2", "--json",
                 str(out_json)]) == 0
    result = json.loads(out_json.read_text())
    assert result["input_shapes"] == {"x": [3, 2, 4], "past": [3, 2, 7, 4]}
    assert result["max_abs_diff_vs_ort"] < 1e-5 and result["ratio_vs_ort"] > 0
    art = str(tmp_path / "art")
    compile_artifact(path, art)
    assert main(["bench", art, "--inputs", inputs, "--against", "ort", "--repeat", "2", "--json",
                 str(out_json)]) == 0
    result = json.loads(out_json.read_text())
    assert result["mode"] == "artifact" and result["input_shapes"]["past"] == [3, 2, 7, 4]
    assert result["max_abs_diff_vs_ort"] < 1e-5
    capsys.readouterr()


@pytest.mark.parametrize("extra, needle", [
    (["--seq", "4"], "drop --seq"),
    (["--inputs", "missing.npz"], "inputs file not found"),
])
def test_inputs_errors(tmp_path, capsys, extra, needle):
    path, inputs = _cache_like_model(tmp_path)
    argv = ["bench", path, *(extra if "--inputs" in extra else ["--inputs", inputs, *extra])]
    assert main(argv) == 2
    _one_line_error(capsys, needle)


def test_inputs_that_do_not_fit_the_model(tmp_path, capsys):
    path, _ = _cache_like_model(tmp_path)
    for feeds, needle in (({"x": np.zeros((3, 2, 4), np.float32)}, "missing input 'past'"),
                          ({"x": np.zeros((3, 5, 4), np.float32), "past": np.zeros((3, 2, 7, 4), np.float32)},
                           "input 'x' has shape (3, 5, 4)")):
        np.savez(tmp_path / "bad.npz", **feeds)
        assert main(["bench", path, "--inputs", str(tmp_path / "bad.npz")]) == 2
        _one_line_error(capsys, needle)
