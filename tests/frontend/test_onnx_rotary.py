"""ONNX's own ``RotaryEmbedding`` op (opset 23; ``frontend/converters/rotary.py``): numerics against ONNX's reference
evaluator for each layout and attribute, and the rotary rule fusing what it writes out (the attention then reads it in
place)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper
from onnx.reference import ReferenceEvaluator

from tvm_fusion_ext.compile import fuse
from tvm_fusion_ext.errors import ModelLoadError
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.runtime import CompiledModel

B, S, H, D, MAX_POS = 2, 5, 2, 8, 12

# name: (input shape, attributes, cache shape, with position ids, the rotary rule fuses it)
CASES = {
    "bhsd_positions": ([B, H, S, D], {}, [MAX_POS, D // 2], True, True),
    "bhsd_per_batch_tables": ([B, H, S, D], {}, [B, S, D // 2], False, True),
    "interleaved": ([B, H, S, D], {"interleaved": 1}, [MAX_POS, D // 2], True, True),
    "partial": ([B, H, S, D], {"rotary_embedding_dim": 4}, [MAX_POS, 2], True, True),
    "bshd_3d": ([B, S, H * D], {"num_heads": H}, [MAX_POS, D // 2], True, True),
    "interleaved_partial_3d": ([B, S, H * D], {"num_heads": H, "interleaved": 1, "rotary_embedding_dim": 4},
                               [B, S, 2], False, True),
}


def _model(shape, attrs, cache, positions, node_name="rope"):
    names = ["x", "cos", "sin"] + (["pos"] if positions else [])
    node = helper.make_node("RotaryEmbedding", names, ["y"], name=node_name, **attrs)
    inputs = [helper.make_tensor_value_info("x", TP.FLOAT, shape),
              helper.make_tensor_value_info("cos", TP.FLOAT, cache),
              helper.make_tensor_value_info("sin", TP.FLOAT, cache)]
    if positions:
        inputs.append(helper.make_tensor_value_info("pos", TP.INT64, [B, S]))
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize("case", sorted(CASES))
def test_onnx_rotary_matches_onnx_reference_and_fuses(case):
    shape, attrs, cache, positions, fuses = CASES[case]
    m = _model(shape, attrs, cache, positions)
    rng = np.random.default_rng(0)
    angles = rng.uniform(0, 6.3, cache).astype(np.float32)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32), "cos": np.cos(angles), "sin": np.sin(angles)}
    if positions:
        feeds["pos"] = rng.integers(0, MAX_POS, (B, S)).astype(np.int64)
    mod = load_onnx(m)
    _, report = fuse(mod)
    assert report.fused["rope"] == int(fuses), report.summary()
    (want,) = ReferenceEvaluator(m).run(None, feeds)
    got = CompiledModel.from_module(mod).run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,attrs,cache,match", [
    ([B, S, H * D], {}, [MAX_POS, D // 2], "needs num_heads"),
    ([B, H, S, D], {"rotary_embedding_dim": 5}, [MAX_POS, 2], "rotary_embedding_dim 5 is odd"),
    ([B, H, S, D], {}, [MAX_POS, 3], "cos_cache's last dim 3 is not half the rotary width 8"),
])
def test_unsupported_forms_are_refused_in_one_line(shape, attrs, cache, match):
    with pytest.raises(ModelLoadError) as info:
        load_onnx(_model(shape, attrs, cache, True))
    msg = str(info.value)
    assert "\n" not in msg and "op 'RotaryEmbedding' (node 'rope')" in msg and match in msg, msg
