"""Helpers of the deploy tests: a hand-built symbolic module with its numpy reference, and manifest editing."""

from __future__ import annotations

import json
import os

import numpy as np

SYMBOLIC_BOUND = 64
SYMBOLIC_INPUTS = ("x.in", "y")  # "x.in" is sanitised by TVM to a Relax name; the artifact keeps the ONNX name
SYMBOLIC_OUTPUTS = ("relu_out", "twice_x")


def symbolic_module():
    """``relu((x + y) @ W)`` and ``2x`` for ``x, y: float32[n, 16]``, ``n <= 64``; returns ``(module, W)``."""
    import tvm
    from tvm import relax

    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x_in", relax.TensorType([n, 16], "float32"))
    y = relax.Var("y", relax.TensorType([n, 16], "float32"))
    w = np.random.default_rng(7).standard_normal((16, 32)).astype("float32")
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(bb.emit(relax.op.add(x, y)), relax.const(w)))
            out = bb.emit_output(relax.Tuple([bb.emit(relax.op.nn.relu(h)),
                                              bb.emit(relax.op.multiply(x, relax.const(2.0, "float32")))]))
        bb.emit_func_output(out)
    mod = bb.get()
    mod["main"] = mod["main"].with_attrs({"tir_var_upper_bound": {"n": SYMBOLIC_BOUND},
                                          "onnx_input_names": list(SYMBOLIC_INPUTS),
                                          "onnx_output_names": list(SYMBOLIC_OUTPUTS)})
    return mod, w


def symbolic_reference(w, feeds):
    x, y = feeds["x.in"], feeds["y"]
    return {"relu_out": np.maximum((x.astype(np.float64) + y) @ w, 0), "twice_x": 2 * x}


def symbolic_feeds(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal((n, 16)).astype("float32") for name in SYMBOLIC_INPUTS}



def reseal(path, edit):
    """Apply ``edit(manifest)`` to the artifact's manifest and recompute its checksum (as a writer would)."""
    from tvm_fusion_ext.deploy.manifest import MANIFEST_FILE, seal

    file = os.path.join(path, MANIFEST_FILE)
    with open(file) as f:
        manifest = json.load(f)
    edit(manifest)
    with open(file, "w") as f:
        json.dump(seal(manifest), f)
