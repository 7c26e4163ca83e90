"""A machine with only TVM's runtime: ``TVM_USE_RUNTIME_LIB=1`` makes TVM load ``libtvm_runtime`` alone (as it
does where ``libtvm_compiler.so`` is absent). Loading and running an artifact, from Python and through
``tvm-fusion run``, must work there, and must import nothing of the compiler side of the package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_LOAD_AND_RUN = textwrap.dedent("""
    import json, sys
    import numpy as np
    from tvm_fusion_ext.deploy import load

    artifact, inputs, output = sys.argv[1:4]
    model = load(artifact)
    with np.load(inputs) as data:
        outputs = model.run({k: data[k] for k in data.files})
    np.savez(output, **outputs)
    # (`import tvm` itself imports tvm.tirx and tvm.te, which work runtime-only)
    heavy = sorted(m for m in sys.modules if m.startswith(("tvm.relax", "tvm.s_tir", "onnx",
                                                           "tvm_fusion_ext.compile", "tvm_fusion_ext.frontend",
                                                           "tvm_fusion_ext.transform", "tvm_fusion_ext.schedules")))
    try:
        from tvm import relax  # noqa: F401
        compiler = True
    except Exception:
        compiler = False
    print(json.dumps({"compiler_importable": compiler, "heavy_modules": heavy}))
""")


def _runtime_only_env():
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _inputs(tmp_path, feeds):
    path = tmp_path / "x.npz"
    np.savez(path, **feeds)
    return str(path)


def test_load_and_run_with_the_runtime_only(tiny_artifact, tiny_onnx, tmp_path):
    from tvm_fusion_ext.deploy import load
    from tvm_fusion_ext.models import sample_inputs

    feeds = sample_inputs(tiny_onnx, seed=5)
    out = tmp_path / "y.npz"
    r = subprocess.run([sys.executable, "-c", _LOAD_AND_RUN, tiny_artifact, _inputs(tmp_path, feeds), str(out)],
                       capture_output=True, text=True, env=_runtime_only_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout.strip().splitlines()[-1])
    assert facts["compiler_importable"] is False  # really runtime-only: `from tvm import relax` fails there
    assert facts["heavy_modules"] == []
    with np.load(out) as got:
        np.testing.assert_array_equal(got["last_hidden_state"], load(tiny_artifact).run(feeds)["last_hidden_state"])


@pytest.mark.parametrize("weight_pages", ["auto", "huge"])  # this small artifact's auto is the file mapping
def test_cli_run_on_an_artifact_with_the_runtime_only(symbolic_artifact, tmp_path, weight_pages):
    from _artifacts import symbolic_feeds, symbolic_reference

    path, w = symbolic_artifact
    feeds = symbolic_feeds(9, seed=2)
    out = tmp_path / "y.npz"
    r = subprocess.run([sys.executable, "-m", "tvm_fusion_ext.cli", "run", path, "--inputs",
                        _inputs(tmp_path, feeds), "--output", str(out)],
                       capture_output=True, text=True, env=dict(_runtime_only_env(), TFX_WEIGHT_PAGES=weight_pages),
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "relu_out: shape [9, 32] dtype float32" in r.stdout
    with np.load(out) as got:
        assert sorted(got.files) == ["relu_out", "twice_x"]
        for name, ref in symbolic_reference(w, feeds).items():
            np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-5)


def test_cli_refusal_with_the_runtime_only(symbolic_artifact, tmp_path):
    """A damaged artifact: one line, exit code 2, no output file, also where TVM is runtime-only."""
    import shutil

    from _artifacts import symbolic_feeds

    path = str(tmp_path / "art")
    shutil.copytree(symbolic_artifact[0], path)
    with open(os.path.join(path, "weights.bin"), "r+b") as f:
        f.truncate(10)
    out = tmp_path / "y.npz"
    r = subprocess.run([sys.executable, "-m", "tvm_fusion_ext.cli", "run", path, "--inputs",
                        _inputs(tmp_path, symbolic_feeds(3)), "--output", str(out)],
                       capture_output=True, text=True, env=_runtime_only_env(), timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "weights.bin is truncated" in lines[0], r.stderr
    assert not out.exists()


_CUDA_RUNTIME = """
import json, os, sys
from tvm_fusion_ext.deploy.host import load_cuda_runtime
import tvm
from tvm.support import nvcc
loaded = load_cuda_runtime()
print(json.dumps({"runtime_only": bool(tvm.base._RUNTIME_ONLY), "loaded": loaded,
                  "cuda_lib": "tvm_runtime_cuda" in tvm.base._LOADED_LIBS,
                  "current": repr(nvcc.Target.current(allow_none=True)),
                  "mode": os.environ.get("TVM_CUDA_COMPILE_MODE")}))
"""


def test_cuda_runtime_with_the_runtime_only():
    """A runtime-only TVM skips its CUDA backend: ``load_cuda_runtime`` loads ``libtvm_runtime_cuda.so`` itself (here
    it cannot: no driver, so False, and the loader then refuses a CUDA artifact in one line), and makes TVM's
    load-time CUDA compile callback work without the compiler library (``Target.current`` answered AttributeError
    on an H100 with only the runtime: every CUDA library failed to load)."""
    env = _runtime_only_env()
    env.pop("TVM_CUDA_COMPILE_MODE", None)
    r = subprocess.run([sys.executable, "-c", _CUDA_RUNTIME], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["runtime_only"] and got["current"] == "None"
    assert got["loaded"] == got["cuda_lib"]
    if shutil.which("nvcc"):
        import importlib.util

        try:
            has_nvrtc = importlib.util.find_spec("cuda.bindings") is not None
        except ImportError:
            has_nvrtc = False
        assert got["mode"] == (None if has_nvrtc else "nvcc")
