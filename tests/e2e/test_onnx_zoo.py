"""The CNNs shipped with the onnx package go through SemanticFusion without errors and keep their meaning.

These "light" models build every weight with ConstantOfShape (constant fills), which makes every output
uniform and a comparison meaningless; the numerics check therefore first gives them random, fan-in scaled
weights (same graph, informative outputs)."""

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402
from tvm import relax  # noqa: E402

from tvm_fusion_ext.compile import fuse  # noqa: E402
from tvm_fusion_ext.frontend import load_onnx  # noqa: E402

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = sorted(f for f in os.listdir(LIGHT) if f.endswith(".onnx")) if os.path.isdir(LIGHT) else []


def _randomised(path, seed=0):
    model = onnx.load(path)
    rng = np.random.default_rng(seed)
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    keep = []
    for n in model.graph.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in consts:
            shape = [int(d) for d in consts[n.input[0]]]
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 0
            value = (rng.uniform(-1, 1, shape) / np.sqrt(fan_in) if fan_in
                     else rng.uniform(0.5, 1.0, shape)).astype("float32")  # vectors: BN scale/var stay positive
            model.graph.initializer.append(numpy_helper.from_array(value, n.output[0]))
        else:
            keep.append(n)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return model


@pytest.mark.parametrize("name", MODELS)
def test_fusion_runs_on_every_cnn(name):
    mod = load_onnx(os.path.join(LIGHT, name))
    fused, report = fuse(mod)
    assert report.fused["attention"] == 0 and report.fused["layernorm"] == 0
    nodes = onnx.load(os.path.join(LIGHT, name)).graph.node
    convs = sum(1 for n in nodes if n.op_type == "Conv" and
                all(a.i == 1 for a in n.attribute if a.name == "group"))
    # every classifier Gemm becomes a fused dense, and so does every ungrouped Conv (a patch gather + matmul): none
    # is left as a conv or a bare matmul
    assert report.canonicalized.get("ConvAsMatmul", 0) >= convs, report.summary()
    left = []

    def visit(e):  # (a grouped conv's batched matmul, one per group, stays a matmul)
        name = getattr(getattr(e, "op", None), "name", "")
        if name == "relax.nn.conv2d" and int(e.attrs.groups) == 1 or name == "relax.matmul" and e.args[1].ty.ndim == 2:
            left.append(name)

    relax.analysis.post_order_visit(fused["main"], visit)
    assert not left, left
    assert report.fused["dense"] >= 1, report.summary()
    fused["main"].script()  # well formed


@pytest.mark.slow
@pytest.mark.parametrize("name", ["light_bvlc_alexnet.onnx", "light_squeezenet.onnx"])
def test_fused_outputs_equal_unfused(name):
    from tvm_fusion_ext.runtime import CompiledModel

    mod = load_onnx(_randomised(os.path.join(LIGHT, name)))
    from tvm_fusion_ext.frontend import input_specs

    feeds = {n: np.random.default_rng(1).standard_normal(s).astype(d) for n, (s, d) in input_specs(mod).items()}
    fused = CompiledModel.from_module(mod, fuse=True).run(feeds)
    plain = CompiledModel.from_module(mod, fuse=False).run(feeds)
    for k in plain:
        assert np.isfinite(plain[k]).all() and np.std(plain[k]) > 0  # informative outputs
        np.testing.assert_allclose(fused[k], plain[k], rtol=1e-4, atol=1e-6)
