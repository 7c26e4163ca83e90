"""``tvm-fusion bench --decode``: a decode step's inputs read from the model's names, its bytes, the JSON contract,
numerics against ONNX Runtime, and one-line errors. No timing assertions."""

import json

import numpy as np
import pytest

from tvm_fusion_ext.cli import main
from tvm_fusion_ext.errors import InputError
from tvm_fusion_ext.frontend.decode_inputs import decode_feeds, decode_shapes, onnx_specs, past_bytes


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    for n in needles:
        assert n in err, err
    return err


def test_decode_shapes_follow_the_model_names_and_layouts(tiny_causal_lm):
    specs = onnx_specs(tiny_causal_lm)
    shapes = decode_shapes(specs, batch=3, past=7, label="m")
    assert shapes["input_ids"] == [3, 1] and shapes["position_ids"] == [3, 1]
    assert shapes["attention_mask"] == [3, 8]
    assert shapes["past_key_values.0.key"] == [3, 2, 7, 16] and shapes["past_key_values.1.value"] == [3, 2, 7, 16]
    feeds = decode_feeds(specs, shapes, past=7, vocab=1000)
    assert (feeds["position_ids"] == 7).all() and (feeds["attention_mask"] == 1).all()
    assert feeds["input_ids"].dtype == np.int64 and feeds["input_ids"].max() < 1000
    assert past_bytes(specs, feeds) == 4 * 3 * 2 * 7 * 16 * 4  # 2 layers x (key, value), fp32
    # the first step: a past of length 0, a mask of one column
    shapes0 = decode_shapes(specs, batch=1, past=0, label="m")
    assert shapes0["past_key_values.0.key"] == [1, 2, 0, 16] and shapes0["attention_mask"] == [1, 1]


def test_decode_shapes_refuse_what_a_step_cannot_fill():
    with pytest.raises(InputError, match="input 'pixel_values' .* is not one a decode step knows"):
        decode_shapes({"pixel_values": ([1, 3, 8, 8], "float32")}, 1, 4, "m")
    with pytest.raises(InputError, match="static past length"):
        decode_shapes({"past_k": (["b", 2, 5, 16], "float32")}, 1, 4, "m")
    with pytest.raises(InputError, match="static dim 0 = 1; --batch asks for 2"):
        decode_shapes({"past_k": ([1, 2, "p", 16], "float32")}, 2, 4, "m")


@pytest.mark.slow  # builds the decoder with its decode branch (~40 s on 2 cores); the inputs are checked above
def test_decode_bench_writes_contract_json(tiny_causal_lm, tmp_path, capsys):
    out_json = tmp_path / "d.json"
    assert main(["bench", tiny_causal_lm, "--decode", "--past", "37", "--batch", "2", "--repeat", "2",
                 "--json", str(out_json)]) == 0
    printed = capsys.readouterr().out
    r = json.loads(out_json.read_text())
    assert r["mode"] == "decode" and r["batch"] == 2 and r["past"] == 37
    assert r["input_shapes"]["past_key_values.1.key"] == [2, 2, 37, 16]
    assert r["cache_bytes"] == 4 * 2 * 2 * 37 * 16 * 4
    assert r["step_bytes"] == r["weight_bytes"] + r["cache_bytes"]
    # the token embedding is read a row per token, not whole: weights are everything else plus those rows
    wb = r["weight_breakdown"]
    assert wb["tables"] == 1000 * 64 * 4 and wb["table_rows_read"] == 2 * 64 * 4
    assert r["weight_bytes"] == wb["weights"] + wb["table_rows_read"]
    host = r["host_read_bandwidth"]
    assert host["gb_per_s"] > 0 and host["bytes"] >= 256 << 20
    assert r["limit_ms"] == pytest.approx(r["step_bytes"] / (host["gb_per_s"] * 1e9) * 1e3)
    ours, ort = r["runtimes"]
    assert ours["name"] == "tvm_fusion_ext" and ort["name"] == "onnxruntime"
    assert ours["max_abs_diff"] < 1e-4 and r["max_abs_diff_vs_ort"] == ours["max_abs_diff"]
    assert ours["gb_per_s"] == pytest.approx(r["step_bytes"] / (ours["median_ms"] * 1e-3) / 1e9)
    assert r["share_of_limit"] == pytest.approx(ours["gb_per_s"] / host["gb_per_s"])
    assert r["ratio_vs_ort"] == pytest.approx(ours["median_ms"] / ort["median_ms"])
    assert "memory limit" in printed and "of limit" in printed and "GB/s" in printed


def test_the_step_and_the_bandwidth_are_timed_in_alternating_blocks(monkeypatch):
    """Each block of step calls follows a block of GEMVs (after a pause for spinning threads); the bandwidth is the
    GEMVs' median, the statistic the step is reported by, with the best and each block's median beside it."""
    import numpy as np

    from tvm_fusion_ext.tools.bench import bandwidth

    monkeypatch.setattr(bandwidth, "SETTLE_SECONDS", 0.0)
    events = []
    stream = bandwidth.ReadStream.__new__(bandwidth.ReadStream)  # a 1 MB "matrix", its calls timed by the script
    stream.matrix, stream.llc = np.zeros((1 << 18,), np.float32), None
    gemv_seconds = iter([1e-3, 2e-3, 4e-3, 1e-3, 2e-3, 2e-3, 1e-3, 1e-3, 1e-3])
    stream.seconds = lambda: events.append("gemv") or next(gemv_seconds)
    timing, host = bandwidth.time_beside_bandwidth("ours", lambda: events.append("call"), repeat=5, rounds=3,
                                                   gemvs=3, stream=stream)
    # one warm-up call; then per round: GEMVs, one untimed call, the round's share of the 5 timed calls (2, 2, 1)
    assert events == ["call"] + ["gemv"] * 3 + ["call"] * 3 + ["gemv"] * 3 + ["call"] * 3 + ["gemv"] * 3 + ["call"] * 2
    assert len(timing.samples_ms) == 5
    mb = stream.matrix.nbytes
    assert host["gb_per_s"] == pytest.approx(mb / 1e-3 / 1e9) == pytest.approx(host["median_gb_per_s"])
    assert host["best_gb_per_s"] == pytest.approx(mb / 1e-3 / 1e9)
    assert host["rounds_gb_per_s"] == pytest.approx([mb / 2e-3 / 1e9, mb / 2e-3 / 1e9, mb / 1e-3 / 1e9])
    assert "median of 9 in 3 blocks" in host["method"]
    stream.seconds = lambda: 1e-3
    timing, host = bandwidth.time_beside_bandwidth("ours", lambda: None, repeat=2, rounds=4, gemvs=1, stream=stream)
    assert len(timing.samples_ms) == 2 and len(host["rounds_gb_per_s"]) == 2  # no more blocks than timed calls


@pytest.mark.parametrize("argv, needle", [
    (["--past", "4"], "--past applies to --decode"),
    (["--decode"], "--decode needs --past P"),
    (["--decode", "--past", "4", "--seq", "8"], "drop --seq"),
    (["--decode", "--past", "-1"], "--past must be >= 0"),
    (["--decode", "--past", "4", "--batch", "0"], "--batch must be positive"),
])
def test_decode_bench_bad_flags_are_one_line_errors(tiny_causal_lm, capsys, argv, needle):
    assert main(["bench", tiny_causal_lm, *argv]) == 2
    _one_line_error(capsys, needle)


@pytest.mark.slow  # another build of the decoder
def test_decode_bench_times_the_first_step_against_an_empty_cache(tiny_causal_lm):
    from tvm_fusion_ext.tools.bench import bench_decode

    r = bench_decode(tiny_causal_lm, past=0, batch=1, repeat=2, out=lambda _: None)
    assert r["cache_bytes"] == 0 and r["input_shapes"]["past_key_values.0.key"] == [1, 2, 0, 16]
    assert r["max_abs_diff_vs_ort"] < 1e-4
    host = r["host_read_bandwidth"]
    assert host["best_gb_per_s"] >= host["gb_per_s"] == host["median_gb_per_s"]


@pytest.mark.slow  # an int8 build of the decoder (~60 s on 2 cores)
def test_decode_bench_counts_the_bytes_an_int8_artifact_streams(tiny_causal_lm, tmp_path, capsys):
    art, out_json = tmp_path / "art", tmp_path / "d.json"
    assert main(["compile", tiny_causal_lm, "-o", str(art), "--precision", "int8"]) == 0
    capsys.readouterr()
    assert main(["bench", str(art), "--onnx", tiny_causal_lm, "--decode", "--past", "5", "--repeat", "2",
                 "--json", str(out_json)]) == 0
    assert "int8 artifact:" in capsys.readouterr().out
    r = json.loads(out_json.read_text())
    wb = r["weight_breakdown"]
    # ONNX Runtime reads the file's fp32 weights; ours are the artifact's, its embedding table a row per token
    assert r["precision"] == "int8" and r["step_bytes"] == r["weight_bytes"] + r["cache_bytes"]
    assert r["ours_step_bytes"] == ((art / "weights.bin").stat().st_size - wb["tables"] + wb["table_rows_read"]
                                    + r["cache_bytes"])
    assert r["ours_step_bytes"] < r["step_bytes"]
    ours, ort = r["runtimes"][0], r["runtimes"][1]
    assert ours["gb_per_s"] * ours["median_ms"] < ort["gb_per_s"] * ort["median_ms"]
