"""``compile --precision``: the precision, its kernels' CPU features and the measured accuracy contract in the
artifact manifest; the artifact loads and runs its bf16/int8 weights; refusals in one line."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_fusion_ext.cli import main
from tvm_fusion_ext.deploy import load


def _mlp(path, relu_only=False):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((32, 48)) / 6).astype("float32"), "w"),
             numpy_helper.from_array(rng.standard_normal(48).astype("float32"), "b"),
             numpy_helper.from_array((rng.standard_normal((48, 24)) / 7).astype("float32"), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    out_dim = 24
    if relu_only:
        nodes, inits, out_dim = [helper.make_node("Relu", ["x"], ["y"])], [], 32
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5, out_dim])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def _reference(path, x):
    import onnxruntime as ort

    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("precision,weight_dtype", [("bf16", "bfloat16"), ("int8", "int8")])
def test_manifest_records_precision_and_contract(tmp_path, capfd, precision, weight_dtype):
    model = _mlp(tmp_path / "mlp.onnx")
    out = tmp_path / "art"
    assert main(["compile", model, "-o", str(out), "--precision", precision]) == 0
    text = capfd.readouterr().out
    assert f"precision {precision}: weights converted in fused_dense 2" in text and "contract holds" in text
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["precision"]
    assert entry["precision"] == precision and entry["converted"] == {"fused_dense": 2}
    assert "avx2" in entry["features"] or not entry["features"]  # what this host's target enables
    accuracy = entry["accuracy"]
    assert accuracy["passed"] and accuracy["samples"] == 3 and accuracy["against"] == "fp32"
    assert accuracy["outputs"]["y"]["min_cosine"] > 0.99 and accuracy["outputs"]["y"]["rows"] == 3 * 2 * 5
    assert weight_dtype in {w["dtype"] for w in manifest["weights"]}
    x = np.random.default_rng(1).standard_normal((3, 5, 32)).astype("float32")
    got = load(str(out)).run({"x": x})["y"]
    assert "Scope Loaded" not in capfd.readouterr().err  # TVM's debugging line per scoped constant is dropped
    want = _reference(model, x)
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()


def test_fp32_manifest_says_fp32(tmp_path):
    model = _mlp(tmp_path / "mlp.onnx")
    assert main(["compile", model, "-o", str(tmp_path / "art")]) == 0
    entry = json.loads((tmp_path / "art" / "manifest.json").read_text())["precision"]
    assert entry["precision"] == "fp32" and "accuracy" not in entry


def test_calibration_inputs_are_used(tmp_path, capsys):
    model = _mlp(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "cal.npz", x=np.random.default_rng(2).standard_normal((4, 5, 32)).astype("float32"))
    assert main(["compile", model, "-o", str(tmp_path / "art"), "--precision", "int8", "--calibration",
                 str(tmp_path / "cal.npz")]) == 0
    accuracy = json.loads((tmp_path / "art" / "manifest.json").read_text())["precision"]["accuracy"]
    assert accuracy["inputs"] == str(tmp_path / "cal.npz") and accuracy["outputs"]["y"]["rows"] == 20


def test_nothing_to_quantise_is_a_note(tmp_path, capsys):
    model = _mlp(tmp_path / "relu.onnx", relu_only=True)
    assert main(["compile", model, "-o", str(tmp_path / "art"), "--precision", "int8"]) == 0
    assert "note: nothing to run in int8" in capsys.readouterr().out


def test_failed_contract_is_reported_not_silent(tmp_path, capsys, monkeypatch):
    from tvm_fusion_ext.compile import accuracy

    monkeypatch.setitem(accuracy.MIN_COSINE, "int8", 1.0)  # a floor no int8 build reaches
    model = _mlp(tmp_path / "mlp.onnx")
    assert main(["compile", model, "-o", str(tmp_path / "art"), "--precision", "int8"]) == 1
    text = capsys.readouterr().out
    assert "contract FAILS" in text and "error: int8 accuracy contract fails: output y row cosine" in text
    assert json.loads((tmp_path / "art" / "manifest.json").read_text())["precision"]["accuracy"]["passed"] is False


@pytest.mark.parametrize("argv,message", [
    (["compile", "{model}", "-o", "{out}", "--precision", "fp8"],
     "error: unknown precision 'fp8' (known: fp32, bf16, int8)"),
    (["compile", "{model}", "-o", "{out}", "--calibration", "{model}"], "error: --calibration measures a bf16 or int8"),
    (["bench", "{model}", "--precision", "int4"], "error: unknown precision 'int4'"),
    (["tune", "{model}", "--precision", "fp16"], "error: unknown precision 'fp16'"),
])
def test_bad_precision_flags_are_one_line(tmp_path, capsys, argv, message):
    model = _mlp(tmp_path / "mlp.onnx")
    code = main([a.format(model=model, out=tmp_path / "art") for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and err[0].startswith(message), err


def test_bf16_artifact_for_a_wider_cpu_is_refused_here_in_one_line(tmp_path, capsys):
    """An AVX-512 bf16 build (Zen 4) records the features its kernels use (its dense multiplies with
    ``vdpbf16ps``: avx512bf16); a CPU without them refuses it at load."""
    from tvm_fusion_ext.deploy import host

    flags = host.cpu_flags()
    if host.machine_arch() != "x86_64" or not flags or "avx512f" in flags:
        pytest.skip("needs an x86_64 Linux machine without AVX-512 (reads /proc/cpuinfo)")
    model = _mlp(tmp_path / "mlp.onnx")
    out = tmp_path / "art"
    # no contract run (it would execute AVX-512 code here): fp32 accuracy is measured where it runs
    from tvm_fusion_ext.compile.artifact import compile_artifact

    manifest = compile_artifact(model, str(out), target="llvm:znver4", precision="bf16")
    assert manifest["precision"]["features"] == ["avx2", "fma", "avx512f", "avx512bf16"]
    assert "accuracy against fp32 not measured: no sample inputs" in manifest["precision"]["notes"]
    np.savez(tmp_path / "x.npz", x=np.zeros((1, 5, 32), np.float32))
    code = main(["run", str(out), "--inputs", str(tmp_path / "x.npz"), "--output", str(tmp_path / "y.npz")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "avx512f" in err[0] and "lacks" in err[0]


def test_bench_against_names_the_low_precision_peers():
    from tvm_fusion_ext.cli.bench import parse_against
    from tvm_fusion_ext.errors import InputError
    from tvm_fusion_ext.tools.bench.precision_peers import LOW_PRECISION_RUNTIMES
    from tvm_fusion_ext.tools.bench.report import RUNTIMES

    known = RUNTIMES + LOW_PRECISION_RUNTIMES
    assert parse_against(None, known, RUNTIMES) == list(RUNTIMES)  # the default is unchanged
    assert parse_against("torch-bf16,ort,ort-int8", known, RUNTIMES) == ["ort", "ort-int8", "torch-bf16"]
    with pytest.raises(InputError, match="unknown runtime 'ort-int4'"):
        parse_against("ort-int4", known, RUNTIMES)


def test_calibration_that_does_not_fit_is_one_line(tmp_path, capsys):
    model = _mlp(tmp_path / "mlp.onnx")
    np.savez(tmp_path / "cal.npz", x=np.zeros((4, 6, 32), np.float32))  # the model's dim 1 is 5
    assert main(["compile", model, "-o", str(tmp_path / "art"), "--precision", "int8", "--calibration",
                 str(tmp_path / "cal.npz")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "calibration input 1 of 1" in err[0] and "'x'" in err[0], err
    assert not (tmp_path / "art").exists()


def test_a_decoder_is_calibrated_on_generation_calls(tiny_causal_lm):
    """Generated calibration for a KV-cache decoder: a prefill against an empty past, a decode step, a chunk;
    each one a call the model takes (mask = past + new, positions after the past)."""
    from tvm_fusion_ext.compile.calibration import generated_samples

    samples = generated_samples(tiny_causal_lm, seq=8)
    assert "prefill" in samples.description and "decode step" in samples.description
    for sample, (past, new) in zip(samples, [(0, 8), (8, 1), (4, 4)]):
        assert sample["input_ids"].shape == (2, new) and sample["attention_mask"].shape == (2, past + new)
        assert sample["past_key_values.0.key"].shape[2] == past
        np.testing.assert_array_equal(sample["position_ids"][0], np.arange(past, past + new))


@pytest.mark.slow
def test_int8_decoder_artifact_is_smoothed_and_holds_the_contract(tiny_causal_lm, tmp_path, capsys):
    assert main(["compile", tiny_causal_lm, "-o", str(tmp_path / "art"), "--precision", "int8"]) == 0
    text = capsys.readouterr().out
    assert "activations smoothed per input channel" in text and "contract holds" in text
    accuracy = json.loads((tmp_path / "art" / "manifest.json").read_text())["precision"]["accuracy"]
    assert accuracy["passed"] and "prefill" in accuracy["inputs"]


def test_generated_calibration_follows_pinned_shape_patterns(tiny_causal_lm):
    """``--shape past_key_values.*:...`` pins every cache input for the generated samples as it does for the build."""
    import onnx as _onnx

    from tvm_fusion_ext.compile.calibration import generated_samples

    graph = _onnx.load(tiny_causal_lm, load_external_data=False).graph
    kv_heads, head_dim = [d.dim_value for d in graph.input[3].type.tensor_type.shape.dim][1::2]
    pinned = {"input_ids": [1, 1], "attention_mask": [1, 9], "position_ids": [1, 1],
              "past_key_values.*": [1, kv_heads, 8, head_dim]}
    for sample in generated_samples(tiny_causal_lm, pinned):
        assert {v.shape for k, v in sample.items() if k.startswith("past_key_values.")} == {(1, kv_heads, 8, head_dim)}
        assert sample["attention_mask"].shape == (1, 9)
