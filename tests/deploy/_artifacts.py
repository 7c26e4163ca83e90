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



def flip_a_byte(path, name, mask: int = 0x01):
    """Flip bits of the byte in the middle of the artifact file ``name`` (same size, other content)."""
    file = os.path.join(path, name)
    with open(file, "r+b") as f:
        f.seek(os.path.getsize(file) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ mask]))


def reseal(path, edit):
    """Apply ``edit(manifest)`` to the artifact's manifest and recompute its checksum (as a writer would)."""
    from tvm_fusion_ext.deploy.manifest import MANIFEST_FILE, seal

    file = os.path.join(path, MANIFEST_FILE)
    with open(file) as f:
        manifest = json.load(f)
    edit(manifest)
    with open(file, "w") as f:
        json.dump(seal(manifest), f)


def dynamic_onnx(path):
    """An ONNX file with dynamic ``batch`` and ``seq`` dims shared by two inputs:
    ``y = relu(x @ W + b) * mask[..., None]`` for ``x: float32[batch, seq, 8]``, ``mask: float32[batch, seq]``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 16)).astype("float32"), "W"),
             numpy_helper.from_array(rng.standard_normal(16).astype("float32"), "b"),
             numpy_helper.from_array(np.array([-1], np.int64), "last")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("Unsqueeze", ["mask", "last"], ["m3"]),
             helper.make_node("Mul", ["r", "m3"], ["y"])]
    graph = helper.make_graph(
        nodes, "dynamic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8]),
                           helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 16])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return str(path)


def dynamic_feeds(batch, seq, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, seq, 8)).astype("float32"),
            "mask": (rng.random((batch, seq)) < 0.8).astype("float32")}
