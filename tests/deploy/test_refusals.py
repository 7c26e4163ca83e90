"""What ``deploy.load`` and ``run`` refuse, each with one line: damaged files, other formats and TVM releases,
CPU features or a GPU this machine lacks (checked before the library is loaded), and inputs that do not fit."""

from __future__ import annotations

import os

import numpy as np
import pytest
from _artifacts import SYMBOLIC_BOUND, flip_a_byte, reseal, symbolic_feeds, symbolic_module

from tvm_fusion_ext.deploy import host, load
from tvm_fusion_ext.deploy.manifest import LIBRARY_FILE, MANIFEST_FILE, WEIGHTS_FILE
from tvm_fusion_ext.errors import ArtifactError, CorruptArtifactError, IncompatibleArtifactError, InputError


def _refused(path, kind, *needles, **kwargs):
    with pytest.raises(kind) as info:
        load(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message and path in message, message
    for needle in needles:
        assert needle in message, message
    return message


# ----------------------------------------------------------------------------------------------- damaged files

@pytest.mark.parametrize("name", [LIBRARY_FILE, WEIGHTS_FILE, MANIFEST_FILE])
def test_missing_file(name, symbolic_artifact, copy_artifact, no_library_loads):
    path = copy_artifact(symbolic_artifact[0])
    os.remove(os.path.join(path, name))
    _refused(path, CorruptArtifactError, name)


def test_truncated_library(symbolic_artifact, copy_artifact, no_library_loads):
    path = copy_artifact(symbolic_artifact[0])
    file = os.path.join(path, LIBRARY_FILE)
    with open(file, "r+b") as f:
        f.truncate(os.path.getsize(file) // 2)
    _refused(path, CorruptArtifactError, LIBRARY_FILE, "truncated")


@pytest.mark.parametrize("name", [LIBRARY_FILE, WEIGHTS_FILE])
def test_flipped_byte(name, symbolic_artifact, copy_artifact, no_library_loads):
    path = copy_artifact(symbolic_artifact[0])
    flip_a_byte(path, name)
    _refused(path, CorruptArtifactError, name, "sha256 mismatch")


def test_edited_manifest(symbolic_artifact, copy_artifact, no_library_loads):
    # raising a bound by hand would let inputs overrun buffers planned for the old one
    path = copy_artifact(symbolic_artifact[0])
    file = os.path.join(path, MANIFEST_FILE)
    with open(file) as f:
        text = f.read()
    with open(file, "w") as f:
        f.write(text.replace(f'"max": {SYMBOLIC_BOUND}', '"max": 4096'))
    assert f'"max": {SYMBOLIC_BOUND}' in text
    _refused(path, CorruptArtifactError, MANIFEST_FILE, "modified after it was written")


def test_not_json_and_not_an_artifact(symbolic_artifact, copy_artifact, tmp_path):
    path = copy_artifact(symbolic_artifact[0])
    with open(os.path.join(path, MANIFEST_FILE), "w") as f:
        f.write('{"format": ')
    _refused(path, CorruptArtifactError, "not valid JSON")
    _refused(str(tmp_path / "nothing_here"), ArtifactError, "no such artifact")
    (tmp_path / "file.so").write_bytes(b"\x7fELF")
    _refused(str(tmp_path / "file.so"), ArtifactError, "not an artifact directory")


# ----------------------------------------------------------------------------------------------- other versions

def test_unknown_format_version(symbolic_artifact, copy_artifact, no_library_loads):
    path = copy_artifact(symbolic_artifact[0])
    reseal(path, lambda m: m.update(format_version=99))
    _refused(path, IncompatibleArtifactError, "format version 99", "recompile")


@pytest.mark.parametrize("field, value, needle", [("tvm", "0.26.0", "TVM 0.26.0"), ("tvm_ffi", "0.2.0", "tvm-ffi 0.2.0")])
def test_other_tvm_release(field, value, needle, symbolic_artifact, copy_artifact, no_library_loads):
    path = copy_artifact(symbolic_artifact[0])
    reseal(path, lambda m: m["producer"].update({field: value}))
    _refused(path, IncompatibleArtifactError, needle)


def test_tvm_ffi_post_release_is_the_same_abi(symbolic_artifact, copy_artifact):
    import tvm_ffi

    path = copy_artifact(symbolic_artifact[0])
    release = tvm_ffi.__version__.split(".post")[0]
    reseal(path, lambda m: m["producer"].update(tvm_ffi=release + ".post99"))
    assert load(path).run(symbolic_feeds(2))["twice_x"].shape == (2, 16)


# ----------------------------------------------------------------------------------------------- this machine

def _absent_x86_feature():
    """An LLVM feature this x86 CPU lacks (so a library using it would die with SIGILL here), or None."""
    flags = host.cpu_flags()
    if host.machine_arch() != "x86_64" or not flags:
        return None
    for feature in ("avx512f", "avx512fp16", "amx-tile", "avx512bf16", "avx512vnni", "fma4", "xop", "avxvnni"):
        if host.LLVM_TO_CPUINFO["x86_64"][feature] not in flags:
            return feature
    return None


def test_cpu_feature_this_machine_lacks(tmp_path, no_library_loads):
    """A real library compiled with ``+feature`` (LLVM cross-compiles it happily) is refused before loading."""
    feature = _absent_x86_feature()
    if feature is None:
        pytest.skip("needs an x86_64 Linux machine lacking one of avx512f/avx512fp16/amx-tile/... (reads "
                    "/proc/cpuinfo)")
    import tvm
    from tvm.target import codegen

    from tvm_fusion_ext.compile import compile_model, save_artifact

    mod, _ = symbolic_module()
    target = tvm.target.Target({"kind": "llvm", "mcpu": str(codegen.llvm_get_system_cpu()), "mattr": [f"+{feature}"]})
    manifest = save_artifact(compile_model(mod, target, fuse_graph=False, lift_weights=True), mod,
                             str(tmp_path / "art"))
    assert feature in manifest["target"]["cpu"]["checked_features"]
    message = _refused(str(tmp_path / "art"), IncompatibleArtifactError, feature, "lacks", "illegal instruction")
    assert "llvm:" in message  # says how to build one that runs here


def test_other_architecture(symbolic_artifact, copy_artifact, no_library_loads):
    other = "aarch64" if host.machine_arch() != "aarch64" else "x86_64"
    path = copy_artifact(symbolic_artifact[0])
    reseal(path, lambda m: m["target"]["cpu"].update(triple=f"{other}-unknown-linux-gnu"))
    _refused(path, IncompatibleArtifactError, f"compiled for {other}", f"this machine is {host.machine_arch()}")


def test_unreadable_cpu_features(symbolic_artifact, monkeypatch):
    path = symbolic_artifact[0]
    monkeypatch.setattr(host, "cpu_flags", lambda *a: None)  # e.g. not Linux
    _refused(path, IncompatibleArtifactError, "cannot read this machine's CPU features", "check_cpu=False")
    assert load(path, check_cpu=False).run(symbolic_feeds(2))["twice_x"].shape == (2, 16)


def test_cuda_artifact_without_a_gpu(tmp_path, no_library_loads):
    import tvm

    if tvm.cuda(0).exist:
        pytest.skip("a GPU is present: the refusal is for machines without one")
    from tvm_fusion_ext.compile import compile_model, save_artifact

    mod, _ = symbolic_module()
    manifest = save_artifact(compile_model(mod, "cuda:sm_80", fuse_graph=False, lift_weights=True), mod,
                             str(tmp_path / "cuda_art"))
    assert manifest["target"]["family"] == "cuda" and manifest["target"]["arch"] == "sm_80"
    _refused(str(tmp_path / "cuda_art"), IncompatibleArtifactError, "CUDA sm_80", "no CUDA GPU")


# ----------------------------------------------------------------------------------------------- inputs

@pytest.mark.parametrize("case, needle", [
    ("unknown_name", "unknown input 'z'"),
    ("missing_name", "missing input 'y'"),
    ("dtype", "input 'y' has dtype float64, expected float32"),
    ("rank", "input 'x.in' has shape [3, 16, 1], the model was built for ['n', 16]"),
    ("static_dim", "input 'y' has shape [3, 15], the model was built for ['n', 16]"),
    ("above_bound", f"input 'x.in' dim 0 (n) is {SYMBOLIC_BOUND + 1}, outside the range the model was compiled "
                    f"for (1..{SYMBOLIC_BOUND})"),
    ("below_bound", f"input 'x.in' dim 0 (n) is 0, outside the range the model was compiled for (1..{SYMBOLIC_BOUND})"),
    ("dims_disagree", "input 'y' dim 0 (n) is 4, but input 'x.in' has n = 3"),
])
def test_input_errors(case, needle, symbolic_artifact):
    path = symbolic_artifact[0]
    model = load(path)
    feeds = symbolic_feeds(3)
    if case == "unknown_name":
        feeds["z"] = feeds["y"]
    elif case == "missing_name":
        del feeds["y"]
    elif case == "dtype":
        feeds["y"] = feeds["y"].astype(np.float64)
    elif case == "rank":
        feeds["x.in"] = feeds["x.in"][..., None]
    elif case == "static_dim":
        feeds["y"] = feeds["y"][:, :15]
    elif case == "above_bound":
        feeds = symbolic_feeds(SYMBOLIC_BOUND + 1)
    elif case == "below_bound":
        feeds = symbolic_feeds(0)
    elif case == "dims_disagree":
        feeds["y"] = symbolic_feeds(4)["y"]
    with pytest.raises(InputError) as info:
        model.run(feeds)
    assert "\n" not in str(info.value) and str(info.value).startswith(path), str(info.value)
    assert needle in str(info.value)
    assert model.run(symbolic_feeds(3))["twice_x"].shape == (3, 16)  # a refused call leaves the model usable
