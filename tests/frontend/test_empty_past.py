"""A past (KV cache) of length 0: the first call of Optimum's and ONNX Runtime GenAI's generation loops feeds
``past_key_values.*`` with no cached tokens (the prompt, or one token, against nothing). A past length's range
starts at 0 (every other symbolic dim at 1), in the symbolic build, the run-time check, the manifest's reasons, and
``shapes=`` / ``--shape`` pins; numerics against ONNX Runtime on a tiny LLaMA exported as Optimum exports it."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

from tvm_fusion_ext.frontend.dims import PAST_MAY_BE_EMPTY, past_length_dims, shape_bounds
from tvm_fusion_ext.errors import InputError
from tvm_fusion_ext.frontend import load_onnx, parse_shape_arg

pytest.importorskip("onnxruntime")


def _feeds(path, batch, new, past, seed=0, left_pad=0):
    proto = onnx.load(path, load_external_data=False)
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(3, 1000, (batch, new)), "attention_mask": np.ones((batch, past + new), np.int64),
             "position_ids": np.tile(np.arange(past, past + new), (batch, 1))}
    if left_pad:
        feeds["attention_mask"][-1, :left_pad] = 0
        feeds["position_ids"][-1] = np.maximum(np.arange(past, past + new) - left_pad, 0)
    for vi in proto.graph.input[3:]:
        feeds[vi.name] = rng.standard_normal((batch, 2, past, 16)).astype(np.float32)
    return feeds


@pytest.fixture(scope="module")
def symbolic_tiny_lm(tiny_causal_lm):
    from tvm_fusion_ext.runtime import CompiledModel

    mod = load_onnx(tiny_causal_lm)
    return mod, CompiledModel.from_module(mod, fuse=True)


def test_only_the_past_length_may_be_empty(tiny_causal_lm):
    inputs = onnx.load(tiny_causal_lm, load_external_data=False).graph.input
    assert past_length_dims(inputs) == {"past_sequence_length"}
    # a past dim that also measures another input (here the mask) is a sequence: it starts at 1
    shared = [helper.make_tensor_value_info("past_k", TP.FLOAT, ["b", 2, "p", 4]),
              helper.make_tensor_value_info("mask", TP.INT64, ["b", "p"])]
    assert past_length_dims(shared) == set()


def test_empty_past_runs_and_matches_onnxruntime(tiny_causal_lm, symbolic_tiny_lm):
    import onnxruntime as ort

    mod, compiled = symbolic_tiny_lm
    bounds = shape_bounds(mod)
    assert bounds["past_sequence_length"][0] == 0 and bounds["sequence_length"][0] == 1
    assert bounds["batch_size"][0] == 1 and bounds["total_sequence_length"][0] == 1
    sess = ort.InferenceSession(tiny_causal_lm)
    names = [o.name for o in sess.get_outputs()]
    # the first step as a single token, as a prompt (one row left-padded), and a later step for contrast
    # (past 100: more keys than the short-key kernels take, so the decode step runs the 1-row query tile)
    for batch, new, past, pad in ((2, 1, 0, 0), (1, 1, 0, 0), (3, 4, 0, 2), (2, 1, 7, 3), (2, 1, 100, 5)):
        feeds = _feeds(tiny_causal_lm, batch, new, past, seed=batch + new + past, left_pad=pad)
        ref = sess.run(None, feeds)
        got = compiled.run(feeds)
        for name, r in zip(names, ref):
            assert got[name].shape == r.shape
            np.testing.assert_allclose(got[name], r, rtol=1e-4, atol=1e-4, err_msg=f"{name} at {(batch, new, past)}")


def test_empty_past_reason_is_recorded_and_other_dims_still_refuse_zero(symbolic_tiny_lm, tiny_causal_lm):
    from tvm_fusion_ext.frontend.dims import bound_reasons

    mod, compiled = symbolic_tiny_lm
    assert bound_reasons(mod)["past_sequence_length"]["lower"] == PAST_MAY_BE_EMPTY
    feeds = _feeds(tiny_causal_lm, 1, 0, 3)
    with pytest.raises(InputError) as err:
        compiled.run(feeds)
    assert "dim 1 (sequence_length) is 0, outside the range the model was compiled for (1..512)" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_static_build_pins_the_past_to_zero(tiny_causal_lm):
    import onnxruntime as ort

    from tvm_fusion_ext.runtime import CompiledModel

    shapes = parse_shape_arg("input_ids:2x3,attention_mask:2x3,position_ids:2x3,"
                             + ",".join(f"past_key_values.{i}.{kv}:2x2x0x16" for i in range(2) for kv in ("key", "value")))
    compiled = CompiledModel.from_module(load_onnx(tiny_causal_lm, shapes=shapes), fuse=True)
    feeds = _feeds(tiny_causal_lm, 2, 3, 0, left_pad=1)
    ref = ort.InferenceSession(tiny_causal_lm).run(["logits"], feeds)[0]
    np.testing.assert_allclose(compiled.run(feeds)["logits"], ref, rtol=1e-4, atol=1e-4)
    # 0 pins a past length only; a bound of 0 and a negative dim stay refused
    with pytest.raises(InputError, match="input 'input_ids' has invalid dimension 0 .*only a past"):
        load_onnx(tiny_causal_lm, shapes={**shapes, "input_ids": [2, 0], "position_ids": [2, 0]})
    with pytest.raises(InputError, match="invalid dimension 0"):
        load_onnx(tiny_causal_lm, max_shapes={"past_key_values.0.key": [2, 2, 0, 16]})
    with pytest.raises(InputError, match="bad shape item"):
        parse_shape_arg("past:1x2x-1x16")


def test_cache_inputs_are_bounded_and_pinned_by_one_pattern(tiny_causal_lm):
    """A decoder has two cache inputs per layer: ``past_key_values.*`` names them all in ``shapes``/``max_shapes``
    (``--shape``/``--max-shape``); an exact name beside the pattern wins, a pattern matching nothing is one line."""
    import onnx as _onnx

    from tvm_fusion_ext.frontend import input_specs

    graph = _onnx.load(tiny_causal_lm, load_external_data=False).graph
    kv = [d.dim_value for d in graph.input[3].type.tensor_type.shape.dim][1::2]  # (kv_heads, head_dim)
    mod = load_onnx(tiny_causal_lm, max_shapes={"past_key_values.*": [3, kv[0], 700, kv[1]],
                                                "attention_mask": [3, 703]})
    assert shape_bounds(mod)["past_sequence_length"] == (0, 700)
    pinned = input_specs(load_onnx(tiny_causal_lm, shapes=parse_shape_arg(
        f"input_ids:1x1,attention_mask:1x6,position_ids:1x1,past_key_values.*:1x{kv[0]}x5x{kv[1]}")))
    assert {spec[0] for name, spec in pinned.items() if name.startswith("past_key_values.")} == {(1, kv[0], 5, kv[1])}
    with pytest.raises(InputError, match=r"pattern 'past\.\*' matches no input; model inputs are: input_ids"):
        load_onnx(tiny_causal_lm, max_shapes={"past.*": [1, 2, 3, 4]})
