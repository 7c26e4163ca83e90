"""compile → artifact → load → run: the loaded model computes what the in-process build computes, bit for bit,
and the manifest says what the artifact is."""

from __future__ import annotations

import json
import os
import platform

import numpy as np
import pytest
from _artifacts import SYMBOLIC_BOUND, SYMBOLIC_INPUTS, SYMBOLIC_OUTPUTS, symbolic_feeds, symbolic_module, \
    symbolic_reference

from tvm_fusion_ext.deploy import load
from tvm_fusion_ext.deploy.manifest import (FORMAT_VERSION, LIBRARY_FILE, MANIFEST_FILE, WEIGHTS_FILE,
                                            sha256_of_file)
from tvm_fusion_ext.deploy.weights import ALIGNMENT


def test_tiny_encoder_artifact_equals_in_process_build(tiny_artifact, tiny_onnx, run_ort):
    from tvm_fusion_ext.models import sample_inputs
    from tvm_fusion_ext.runtime import CompiledModel

    model = load(tiny_artifact)
    in_process = CompiledModel.from_onnx(tiny_onnx)
    assert model.input_specs == in_process.input_specs
    assert model.output_names == in_process.output_names
    for seed in (0, 1):
        feeds = sample_inputs(tiny_onnx, seed=seed)
        got, want = model.run(feeds), in_process.run(feeds)
        assert list(got) == list(want) == ["last_hidden_state"]
        np.testing.assert_array_equal(got["last_hidden_state"], want["last_hidden_state"])  # same kernels
        np.testing.assert_allclose(got["last_hidden_state"], run_ort(tiny_onnx, feeds)[0], rtol=1e-4, atol=1e-4)


def test_manifest_describes_the_artifact(tiny_artifact, tiny_onnx, capsys):
    import tvm
    import tvm_ffi

    from tvm_fusion_ext.cli import main

    with open(os.path.join(tiny_artifact, MANIFEST_FILE)) as f:
        manifest = json.load(f)
    assert manifest["format_version"] == FORMAT_VERSION
    assert manifest["producer"]["tvm"] == tvm.__version__ and manifest["producer"]["tvm_ffi"] == tvm_ffi.__version__
    assert manifest["source"]["path"] == os.path.abspath(tiny_onnx)
    assert manifest["source"]["sha256"] == sha256_of_file(tiny_onnx)
    assert manifest["inputs"] == [{"name": "input_ids", "dtype": "int64", "shape": [1, 32]},
                                  {"name": "attention_mask", "dtype": "int64", "shape": [1, 32]}]
    assert manifest["outputs"] == [{"name": "last_hidden_state", "dtype": "float32", "shape": [1, 32, 64]}]
    assert manifest["dims"] == {}
    # the fusion summary is what `tvm-fusion fuse` reports on the same file
    assert main(["fuse", tiny_onnx, "--json"]) == 0
    assert manifest["fusion"]["fused"] == json.loads(capsys.readouterr().out)["fused"]
    assert manifest["records"] == {"dir": None, "note": "no tuning records given; template default knobs"}
    # the target as TVM writes it, and the CPU features it lets LLVM use
    target = manifest["target"]
    assert target["family"] == "cpu" and target["config"]["kind"] == "llvm" and target["config"]["mcpu"]
    checked = set(target["cpu"]["checked_features"])
    assert checked <= set(target["cpu"]["llvm_features"])
    assert not checked & {"fast-15bytenop", "slow-3ops-lea", "mwaitx", "xsaves"}  # tuning hints, system instructions
    if platform.machine() in ("x86_64", "AMD64"):
        assert {"sse2"} <= checked
    # every file is listed with its size and digest; weights are 64-byte aligned and inside the file
    for name in (LIBRARY_FILE, WEIGHTS_FILE):
        entry = manifest["files"][name]
        file = os.path.join(tiny_artifact, name)
        assert entry == {"bytes": os.path.getsize(file), "sha256": sha256_of_file(file)}
    weights = manifest["weights"]
    assert weights and all(w["offset"] % ALIGNMENT == 0 for w in weights)
    assert max(w["offset"] + w["bytes"] for w in weights) == manifest["files"][WEIGHTS_FILE]["bytes"]
    assert sorted(os.listdir(tiny_artifact)) == sorted([MANIFEST_FILE, LIBRARY_FILE, WEIGHTS_FILE])


def test_weights_live_beside_the_library(tiny_artifact):
    # the library holds code and small constants only: the weights file is what grows with the model
    with open(os.path.join(tiny_artifact, MANIFEST_FILE)) as f:
        manifest = json.load(f)
    lifted = sum(w["bytes"] for w in manifest["weights"])
    embedding = 100 * 64 * 4  # build_encoder_onnx: vocab 100 x hidden 64, float32
    assert lifted > embedding
    assert sum(np.prod(w["shape"]) * np.dtype(w["dtype"]).itemsize for w in manifest["weights"]) == lifted


@pytest.mark.parametrize("n", [1, 5, 31, SYMBOLIC_BOUND])
def test_symbolic_artifact_at_several_lengths(symbolic_artifact, n):
    """One artifact, any length up to the bound: equal to numpy, and bit for bit to the in-process build of
    the same module (weights inside the library)."""
    import tvm
    from tvm import relax

    from tvm_fusion_ext.compile import compile_model

    path, w = symbolic_artifact
    model = load(path)
    feeds = symbolic_feeds(n, seed=n)
    got = model.run(feeds)
    assert list(got) == list(SYMBOLIC_OUTPUTS) and got["relu_out"].shape == (n, 32)
    for name, ref in symbolic_reference(w, feeds).items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-5)
    mod, _ = symbolic_module()
    vm = relax.VirtualMachine(compile_model(mod, "llvm", fuse_graph=False).executable, tvm.cpu())
    want = vm["main"](*[tvm.runtime.tensor(feeds[k]) for k in SYMBOLIC_INPUTS])
    np.testing.assert_array_equal(got["relu_out"], want[0].numpy())
    np.testing.assert_array_equal(got["twice_x"], want[1].numpy())


def test_symbolic_manifest_keeps_dim_names_and_bounds(symbolic_artifact):
    path, _ = symbolic_artifact
    model = load(path)
    assert model.input_specs == {"x.in": (("n", 16), "float32"), "y": (("n", 16), "float32")}
    assert model.dim_bounds == {"n": (1, SYMBOLIC_BOUND)}
    assert model.manifest["dims"] == {"n": {"min": 1, "max": SYMBOLIC_BOUND}}
    assert model.manifest["outputs"] == [{"name": "relu_out", "dtype": "float32", "shape": ["n", 32]},
                                         {"name": "twice_x", "dtype": "float32", "shape": ["n", 16]}]
    assert model.manifest["fusion"] is None  # compiled without fusion
    assert [w["shape"] for w in model.manifest["weights"]] == [[16, 32]]  # W lifted; the scalar 2.0 stays


def test_records_applied_are_recorded(tmp_path, tiny_onnx):
    """A record directory that matches the model and target is named in the manifest with its manifest's
    digest (here an empty one: it matches, and changes no kernel)."""
    from tvm_fusion_ext import records
    from tvm_fusion_ext.compile import compile_artifact
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.targets import resolve_target

    logs = tmp_path / "logs" / "tiny"
    logs.mkdir(parents=True)
    for name in (records.WORKLOAD_FILE, records.RECORD_FILE):
        (logs / name).write_text("")
    records.write_manifest(str(logs), {"model_hash": records.model_hash(load_onnx(tiny_onnx)),
                                       "target": records.target_label(resolve_target("llvm")), "trials": 0})
    manifest = compile_artifact(tiny_onnx, str(tmp_path / "art"), logs=str(tmp_path / "logs"))
    entry = manifest["records"]
    assert entry["dir"] == str(logs) and entry["trials"] == 0
    assert entry["manifest_sha256"] == sha256_of_file(str(logs / records.MANIFEST_FILE))
    assert "using tuning records in" in entry["note"]


def test_recompiling_replaces_an_artifact_and_nothing_else(tmp_path, symbolic_artifact):
    from tvm_fusion_ext.compile import compile_model, save_artifact
    from tvm_fusion_ext.errors import ArtifactError

    mod, _ = symbolic_module()
    compiled = compile_model(mod, "llvm", fuse_graph=False, lift_weights=True)
    out = tmp_path / "art"
    first = save_artifact(compiled, mod, str(out))
    second = save_artifact(compiled, mod, str(out))  # over an earlier artifact: replaced
    assert second["created"] >= first["created"]
    assert load(str(out)).run(symbolic_feeds(3))["twice_x"].shape == (3, 16)
    assert sorted(os.listdir(tmp_path)) == ["art"]  # no temporary or old directory left behind
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    for victim in (tmp_path / "notes", tmp_path / "notes" / "keep.txt"):
        with pytest.raises(ArtifactError, match="refusing to replace|is a file"):
            save_artifact(compiled, mod, str(victim))
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"


def test_a_failed_write_leaves_no_partial_artifact(tmp_path, monkeypatch):
    from tvm_fusion_ext.compile import artifact, compile_model, save_artifact

    mod, _ = symbolic_module()
    compiled = compile_model(mod, "llvm", fuse_graph=False, lift_weights=True)

    def broken(f, tensors):
        f.write(b"half a weight")
        raise OSError("disk full")

    monkeypatch.setattr(artifact, "write_weights", broken)
    with pytest.raises(OSError, match="disk full"):
        save_artifact(compiled, mod, str(tmp_path / "art"))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("value", [
    np.arange(48, dtype=np.int64).reshape(3, 16)[:, ::2],       # strided: the copy is contiguous
    np.array([[True, False, True]]),
    np.linspace(-1, 1, 7, dtype=np.float16),
    np.array(3.5, np.float32),                                  # 0-d
    np.zeros((0, 5), np.int32),                                 # no elements
])
def test_inputs_reach_the_model_as_private_aligned_copies(value):
    """deploy.io.input_tensors: one copy per input, 64-byte aligned (TVM's kernels may assume it for vector loads),
    never the caller's memory (a caller may reuse its array while the model runs)."""
    import tvm

    from tvm_fusion_ext.deploy.io import input_tensors

    source = value.copy()
    (tensor,) = input_tensors([source], tvm.cpu())
    view = np.from_dlpack(tensor)
    assert tensor.shape == value.shape and str(tensor.dtype) == str(value.dtype)
    np.testing.assert_array_equal(tensor.numpy(), value)
    if value.size:
        assert view.ctypes.data % ALIGNMENT == 0
        assert not np.shares_memory(view, source)
        source[...] = 0 if value.dtype != bool else False
        np.testing.assert_array_equal(tensor.numpy(), value)


@pytest.mark.parametrize("value", [
    np.zeros((2, 4, 0, 64), np.float32),                                       # a first decode step's past
    np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (2, 4, 0, 64), (1024, 256, 256, 4)),
    np.zeros((0,), np.int64),
])
def test_inputs_with_no_elements_have_compact_strides(value):
    """A kernel's argument check wants the compact strides of the shape; numpy exports an empty array's strides as
    its own layout says (all zeros, or whatever a reshape left), so an empty input must not reach TVM as a view."""
    import tvm

    from tvm_fusion_ext.deploy.io import input_tensors

    (tensor,) = input_tensors([value], tvm.cpu())
    compact = [int(np.prod(value.shape[i + 1:])) for i in range(value.ndim)]
    assert tensor.shape == value.shape and list(tensor.strides) == compact
