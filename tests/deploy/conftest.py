"""Artifacts shared by the deploy tests, each compiled once per session (a few seconds each).

* ``tiny_artifact``: the built-in tiny encoder (fused, templates), static shapes, with its ONNX file.
* ``symbolic_artifact``: :func:`_artifacts.symbolic_module`, a hand-built Relax module with a symbolic dim ``n``
  (upper bound 64, as the frontend sets through ``tir_var_upper_bound``), two inputs sharing ``n``, a lifted
  weight, two outputs, and an ONNX name TVM would sanitise. Compiled without fusion: templates decline
  symbolic kernels and the fallback schedules them.

Tests that damage an artifact work on a copy (``copy_artifact``).
"""

from __future__ import annotations

import os
import shutil

import pytest
from _artifacts import symbolic_module


@pytest.fixture(scope="session")
def artifact_root(tmp_path_factory):
    return tmp_path_factory.mktemp("artifacts")


@pytest.fixture(scope="session")
def tiny_onnx(artifact_root):
    import onnx

    from tvm_fusion_ext.models import build_encoder_onnx

    path = artifact_root / "tiny.onnx"
    onnx.save(build_encoder_onnx(), str(path))
    return str(path)


@pytest.fixture(scope="session")
def tiny_artifact(artifact_root, tiny_onnx):
    from tvm_fusion_ext.compile import compile_artifact

    out = str(artifact_root / "tiny_artifact")
    compile_artifact(tiny_onnx, out)
    return out


@pytest.fixture(scope="session")
def symbolic_artifact(artifact_root):
    """``(artifact path, W)``."""
    from tvm_fusion_ext.compile import compile_model, save_artifact

    mod, w = symbolic_module()
    out = str(artifact_root / "symbolic_artifact")
    save_artifact(compile_model(mod, "llvm", fuse_graph=False, lift_weights=True), mod, out)
    return out, w


@pytest.fixture
def copy_artifact(tmp_path):
    """``copy_artifact(src) -> path`` of a private copy to damage."""
    def copy(src):
        dst = tmp_path / os.path.basename(src)
        shutil.copytree(src, dst)
        return str(dst)

    return copy


@pytest.fixture
def no_library_loads(monkeypatch):
    """Fails the test if anything calls ``tvm.runtime.load_module``: a refusal (or a description) must come
    without loading the library."""
    import tvm

    def forbidden(*args, **kwargs):
        raise AssertionError("the library was loaded")

    monkeypatch.setattr(tvm.runtime, "load_module", forbidden)
