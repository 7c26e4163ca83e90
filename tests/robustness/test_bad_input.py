"""Bad input through the CLI: one line ``error: ...`` naming the problem, exit code 2, no output file.

Complements ``tests/cli/test_cli.py`` (missing model, junk bytes, misspelt input name, wrong shape, ``--target
tpu``), which is not repeated here. Most cases call ``tvm_fusion_ext.cli.main`` in-process (the same code as
the console script; ``capfd`` sees the process's real stderr, TVM's C++ output included); the cases where a
crash would kill the process (out-of-range token ids) and one of each family run the console entry point in a
subprocess. ``BAD_INPUTS`` counts the bad inputs tried (printed by the last test; figures in README.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tvm_fusion_ext.cli import main

BAD_INPUTS: list = []


def _cli_subprocess(*args):
    return subprocess.run([sys.executable, "-m", "tvm_fusion_ext.cli", *args], capture_output=True, text=True,
                          timeout=300)


def _one_line_error(rc, err, *needles, out_dir=None):
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    if out_dir is not None:  # no output and no temp file left behind
        assert not [p for p in os.listdir(out_dir) if p.startswith(("y", ".tmp-"))], os.listdir(out_dir)
    return lines[0]


def _expect_error(capfd, argv, *needles, out_dir=None, label=None):
    rc = main(argv)
    err = capfd.readouterr().err
    BAD_INPUTS.append(label or " ".join(argv[:1]) + ": " + needles[0])
    return _one_line_error(rc, err, *needles, out_dir=out_dir)


# ---------------------------------------------------------------------------------------------------------
# model files
# ---------------------------------------------------------------------------------------------------------

def _tiny_dynamic_model(path, op=None, domain=""):
    """y = relu(x @ W + b) with x: [batch, 4] (batch dynamic); optionally one extra node of ``op``."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("W", TensorProto.FLOAT, [4, 3], rng.standard_normal(12).astype("float32"))
    b = helper.make_tensor("B", TensorProto.FLOAT, [3], rng.standard_normal(3).astype("float32"))
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "B"], ["a"], name="add")]
    if op:
        nodes.append(helper.make_node(op, ["a"], ["y"], name="strange_node", domain=domain))
    else:
        nodes.append(helper.make_node("Relu", ["a"], ["y"], name="relu"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], [w, b])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return str(path), model


def _ill_typed_layernorm_model(path):
    """y = LayerNormalization(x @ W) with float32 data and float16 scale and bias: ONNX binds all three to one type
    (torch's legacy exporter writes such files from fp16 models), so the file is invalid, not our gap."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("W", TensorProto.FLOAT, [4, 3], rng.standard_normal(12).astype("float32"))
    scale = helper.make_tensor("S", TensorProto.FLOAT16, [3], np.ones(3, "float16").view("uint16"), raw=False)
    bias = helper.make_tensor("Z", TensorProto.FLOAT16, [3], np.zeros(3, "float16").view("uint16"), raw=False)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("LayerNormalization", ["h", "S", "Z"], ["y"], name="mixed_norm", axis=-1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w, scale, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path.write_bytes(model.SerializeToString())
    return str(path)


@pytest.fixture()
def good_inputs(tiny_encoder_path, tmp_path):
    from tvm_fusion_ext.models import sample_inputs

    feeds = sample_inputs(tiny_encoder_path, seed=1)
    path = tmp_path / "x.npz"
    np.savez(path, **feeds)
    return str(path), feeds


@pytest.mark.parametrize("case", ["truncated", "empty", "directory", "foreign_protobuf", "custom_domain_op",
                                  "unknown_default_op", "ill_typed"])
def test_bad_model_files(case, tiny_encoder_path, tmp_path, capfd, good_inputs):
    if case == "truncated":
        data = open(tiny_encoder_path, "rb").read()
        model = tmp_path / "trunc.onnx"
        model.write_bytes(data[: len(data) // 2])
        needles = ["trunc.onnx"]
    elif case == "empty":
        model = tmp_path / "empty.onnx"
        model.write_bytes(b"")
        needles = ["empty.onnx", "not"]
    elif case == "directory":
        model = tmp_path / "dir.onnx"
        model.mkdir()
        needles = ["dir.onnx", "directory"]
    elif case == "foreign_protobuf":  # valid protobuf, but a TensorProto, not a ModelProto
        model = tmp_path / "tensor.onnx"
        model.write_bytes(helper.make_tensor("t", TensorProto.FLOAT, [2], [1.0, 2.0]).SerializeToString())
        needles = ["tensor.onnx", "ONNX model"]
    elif case == "custom_domain_op":
        model, _ = _tiny_dynamic_model(tmp_path / "custom.onnx", op="FancyNorm", domain="com.example")
        needles = ["com.example.FancyNorm", "strange_node", "not supported"]
    elif case == "ill_typed":  # TVM's converter fails on it; the error must name ONNX's verdict, not TVM's symptom
        model = _ill_typed_layernorm_model(tmp_path / "ill.onnx")
        needles = ["ill.onnx", "not a valid ONNX model", "LayerNormalization", "mixed_norm"]
    else:
        model, _ = _tiny_dynamic_model(tmp_path / "unknown.onnx", op="NotARealOp")
        needles = ["NotARealOp", "not supported"]
    shape = [] if case not in ("custom_domain_op", "unknown_default_op") else ["--shape", "x:2x4"]
    for argv in (["fuse", str(model), *shape],
                 ["run", str(model), *shape, "--inputs", good_inputs[0], "--output", str(tmp_path / "y.npz")]):
        _expect_error(capfd, argv, *needles, out_dir=tmp_path, label=f"model file: {case} ({argv[0]})")


def test_unsupported_op_in_subprocess(tmp_path):
    model, _ = _tiny_dynamic_model(tmp_path / "custom.onnx", op="FancyNorm", domain="com.example")
    r = _cli_subprocess("fuse", model, "--shape", "x:2x4")
    BAD_INPUTS.append("model file: custom-domain op (subprocess)")
    _one_line_error(r.returncode, r.stderr, "com.example.FancyNorm")


def test_dynamic_dims_run_symbolic_and_bad_shape_flags(tmp_path, capfd):
    model, proto = _tiny_dynamic_model(tmp_path / "dyn.onnx")
    x = np.random.default_rng(2).standard_normal((2, 4)).astype("float32")
    np.savez(tmp_path / "x.npz", x=x)
    run = ["run", model, "--inputs", str(tmp_path / "x.npz"), "--output", str(tmp_path / "y.npz")]
    for bad_shape, needle in (("y:2x4", "unknown input 'y'"), ("x:2", "rank"), ("x:2x5", "fixed to 4"),
                              ("x:0x4", "only a past (KV cache) length may be 0"), ("x=2x4", "bad shape item")):
        _expect_error(capfd, run + ["--shape", bad_shape], needle, out_dir=tmp_path,
                      label=f"--shape {bad_shape}")
    # a bound the input exceeds: refused before running, naming the input, the dim and the range
    _expect_error(capfd, run + ["--max-shape", "x:1x4"], "'x'", "dim 0", "1..1", out_dir=tmp_path,
                  label="--max-shape below the input")
    _expect_error(capfd, run + ["--max-shape", "x:2x5"], "fixed to 4", out_dir=tmp_path, label="--max-shape rank")
    ort = pytest.importorskip("onnxruntime")
    ref = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    # without --shape the dynamic dim stays symbolic; with it the build is static: both equal onnxruntime
    for extra in ([], ["--shape", "x:2x4"]):
        assert main(run + extra) == 0
        capfd.readouterr()
        np.testing.assert_allclose(np.load(tmp_path / "y.npz")["y"], ref, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# inputs files
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["missing_input", "extra_input", "wrong_dtype", "float_ids", "wrong_rank",
                                  "no_file", "not_npz", "pickled_object"])
def test_bad_inputs_file(case, tiny_encoder_path, tmp_path, capfd, good_inputs):
    _, feeds = good_inputs
    feeds = dict(feeds)
    first = next(iter(feeds))
    path = tmp_path / "bad.npz"
    if case == "missing_input":
        dropped = list(feeds)[-1]
        del feeds[dropped]
        needles = ["missing input", dropped]
    elif case == "extra_input":
        feeds["token_type_ids"] = feeds[first]
        needles = ["unknown input 'token_type_ids'"]
    elif case == "wrong_dtype":
        feeds[first] = feeds[first].astype("int32")
        needles = [first, "dtype int32", "int64"]
    elif case == "float_ids":
        feeds[first] = feeds[first].astype("float32")
        needles = [first, "float32"]
    elif case == "wrong_rank":
        feeds[first] = feeds[first][0]
        needles = [first, "shape"]
    if case == "no_file":
        path = tmp_path / "nothere.npz"
        needles = ["nothere.npz", "not found"]
    elif case == "not_npz":
        path.write_text("a,b\n1,2\n")
        needles = ["bad.npz", "npz"]
    elif case == "pickled_object":  # object arrays need pickle: refused, never unpickled
        np.savez(path, **{first: np.array([{"a": 1}], dtype=object)})
        needles = ["bad.npz"]
    else:
        np.savez(path, **feeds)
    _expect_error(capfd, ["run", tiny_encoder_path, "--inputs", str(path), "--output", str(tmp_path / "y.npz")],
                  *needles, out_dir=tmp_path, label=f"inputs file: {case}")


# ---------------------------------------------------------------------------------------------------------
# targets
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target,needle", [("cuda:sm_9x", "sm_9x"), ("cuda:ampere", "ampere"),
                                           ("cuda:", "architecture"), ("llvm-x86", "llvm-x86"),
                                           ("nvidia/not-a-gpu", "nvidia/not-a-gpu")])
def test_bad_targets(target, needle, tiny_encoder_path, tmp_path, capfd, good_inputs):
    _expect_error(capfd, ["run", tiny_encoder_path, "--inputs", good_inputs[0], "--output", str(tmp_path / "y.npz"),
                          "--target", target], needle, out_dir=tmp_path, label=f"target {target}")


def test_bad_arch_for_inspect_and_tune(tiny_encoder_path, tmp_path, capfd):
    _expect_error(capfd, ["tune", tiny_encoder_path, "--target", "cuda:sm_9x", "--trials", "1",
                          "--logs", str(tmp_path / "L")], "sm_9x", label="tune --target cuda:sm_9x")
    assert not (tmp_path / "L").exists()  # refused before anything was written
    _expect_error(capfd, ["tune", tiny_encoder_path, "--target", "tpu", "--trials", "1",
                          "--logs", str(tmp_path / "L")], "tpu", label="tune --target tpu")


# ---------------------------------------------------------------------------------------------------------
# tuning logs
# ---------------------------------------------------------------------------------------------------------

def _record_dir(root, name="tiny-llvm-x", manifest=None, workload=None, records=None):
    d = root / name
    d.mkdir(parents=True)
    if manifest is not None:
        (d / "manifest.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    if workload is not None:
        (d / "database_workload.json").write_text(workload)
    if records is not None:
        (d / "database_tuning_record.json").write_text(records)
    return d


def _this_model_identity(path):
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.records import model_hash, target_label

    return model_hash(load_onnx(path)), target_label(resolve_target("llvm"))


@pytest.mark.parametrize("case", ["missing_dir", "garbage_manifest", "garbage_database", "foreign_model",
                                  "foreign_target", "garbage_manifest_under_root"])
def test_bad_logs_are_refused(case, tiny_encoder_path, tmp_path, capfd, good_inputs):
    mhash, label = _this_model_identity(tiny_encoder_path)
    logs = tmp_path / "logs"
    if case == "missing_dir":
        needles = ["does not exist"]
    elif case == "garbage_manifest":
        logs = _record_dir(tmp_path, manifest="{this is not json")
        needles = ["manifest.json", "not valid JSON"]
    elif case == "garbage_database":  # several garbage lines: not a crash leftover, cannot be repaired
        logs = _record_dir(tmp_path, workload="garbage\n{also garbage\n[1, 2]\n",
                           manifest={"model_hash": mhash, "target": label})
        needles = ["corrupt"]
    elif case == "foreign_model":
        logs = _record_dir(tmp_path, manifest={"model_hash": "0123456789abcdef", "target": label},
                           workload="", records="")
        needles = ["0123456789abcdef", "not for this model"]
    elif case == "foreign_target":
        logs = _record_dir(tmp_path, manifest={"model_hash": mhash, "target": "cuda-sm_90"}, workload="", records="")
        needles = ["cuda-sm_90", label]
    else:
        _record_dir(logs, manifest="][")
        needles = ["manifest.json"]
    _expect_error(capfd, ["run", tiny_encoder_path, "--inputs", good_inputs[0], "--output", str(tmp_path / "y.npz"),
                          "--logs", str(logs)], *needles, out_dir=tmp_path, label=f"--logs {case}")


def test_foreign_records_under_a_root_are_ignored_with_a_message(tiny_encoder_path, tmp_path, capfd, good_inputs,
                                                                 run_ort):
    """A root holding only another model's records: the build says so and runs untuned (correct numbers)."""
    mhash, label = _this_model_identity(tiny_encoder_path)
    root = tmp_path / "logs"
    _record_dir(root, "other-llvm", manifest={"model_hash": "feedfacefeedface", "target": label},
                workload="", records="")
    _record_dir(root, "this-cuda", manifest={"model_hash": mhash, "target": "cuda-sm_90"}, workload="", records="")
    out = tmp_path / "y.npz"
    assert main(["run", tiny_encoder_path, "--inputs", good_inputs[0], "--output", str(out), "--logs", str(root)]) == 0
    cap = capfd.readouterr()
    BAD_INPUTS.append("--logs root with only foreign record dirs (ignored, message)")
    assert "no tuning records" in cap.out and "2 directories checked" in cap.out and "untuned" in cap.out
    # which host classes the records there cover, and how to tune for this one
    assert f"they cover other-llvm on {label}, this-cuda on cuda-sm_90" in cap.out
    assert f"`tvm-fusion tune MODEL.onnx --target {label.replace('-', ':', 1)} --logs {root}`" in cap.out
    ref = run_ort(tiny_encoder_path, good_inputs[1])[0]
    np.testing.assert_allclose(np.load(out)["last_hidden_state"], ref, rtol=1e-4, atol=1e-4)


def test_select_api_on_foreign_and_corrupt(tiny_encoder_path, tmp_path):
    """``tune.logs.select`` directly: foreign record dir refused, foreign under a root ignored, both one line."""
    from tvm_fusion_ext.errors import TuningLogError
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.records import select

    mod, target = load_onnx(tiny_encoder_path), resolve_target("llvm")
    d = _record_dir(tmp_path / "root", manifest={"model_hash": "1", "target": "x"}, workload="", records="")
    with pytest.raises(TuningLogError, match="not for this model"):
        select(str(d), mod, target)
    chosen, msg = select(str(tmp_path / "root"), mod, target)
    assert chosen is None and "building untuned" in msg and "\n" not in msg
    BAD_INPUTS.append("select(): foreign record dir / foreign root")


# ---------------------------------------------------------------------------------------------------------
# out-of-range token ids: refused in one line (as onnxruntime refuses them), never a crash or a clamped answer
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.slow  # 22 s through the CLI; tests/compile/test_gather_checks.py checks the refusal by default
def test_out_of_range_token_ids_are_refused_not_a_crash(tiny_encoder_path, tmp_path, good_inputs, run_ort):
    """ids = vocab + 1000 and int64 min, through ``tvm-fusion run`` in a subprocess (a segfault would show as a
    negative return code): exit 2 and one line naming ``input_ids`` (``compile/checks/gather_indices.py``; before session
    18 the embedding ``take`` clamped them, and the model answered with the table's last or first row). A
    negative id inside ``[-vocab, -1]`` is valid ONNX (counts from the end) and is honoured, as onnxruntime
    honours it."""
    from tvm_fusion_ext.models import vocab_size

    _, feeds = good_inputs
    vocab = vocab_size(onnx.load(tiny_encoder_path).graph, "input_ids")
    assert vocab and vocab > 1
    ids = feeds["input_ids"].copy()
    ids[0, 1] = -5
    np.savez(tmp_path / "neg.npz", **dict(feeds, input_ids=ids))
    out = tmp_path / "y.npz"
    r = _cli_subprocess("run", tiny_encoder_path, "--inputs", str(tmp_path / "neg.npz"), "--output", str(out))
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    ref = run_ort(tiny_encoder_path, dict(feeds, input_ids=ids))[0]
    np.testing.assert_allclose(np.load(out)["last_hidden_state"], ref, rtol=1e-4, atol=1e-4)
    BAD_INPUTS.extend(["token id vocab+1000", "token id int64 min"])
    for bad in (vocab + 1000, np.iinfo(np.int64).min):
        ids[0, 0] = bad
        np.savez(tmp_path / "bad.npz", **dict(feeds, input_ids=ids))
        r = _cli_subprocess("run", tiny_encoder_path, "--inputs", str(tmp_path / "bad.npz"), "--output",
                            str(tmp_path / "bad_out.npz"))
        assert r.returncode == 2, (r.returncode, r.stderr[-2000:])  # < 0 would be a signal (segfault)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and f"input 'input_ids' holds 1 value outside {-vocab} .. {vocab - 1}" in lines[0], \
            r.stderr
        assert not (tmp_path / "bad_out.npz").exists()
        with pytest.raises(Exception, match="out of"):  # onnxruntime refuses them too
            run_ort(tiny_encoder_path, dict(feeds, input_ids=ids))


def test_bad_input_figures():
    """Last in the file: prints how many bad inputs were tried (figures for README.md)."""
    if not BAD_INPUTS:
        pytest.skip("no bad-input test ran in this session")
    sys.__stdout__.write(f"\n[bad-input] tried {len(BAD_INPUTS)} bad inputs: {BAD_INPUTS}\n")
