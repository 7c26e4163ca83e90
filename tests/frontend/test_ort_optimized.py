"""ONNX Runtime's contrib ops (``com.microsoft``, as ``onnxruntime.transformers.optimizer`` writes them;
``tvm_fusion_ext/frontend/ort_contrib/``): each op and attribute form in a one-node graph against ONNX Runtime running
the same graph, the fusion each one is written for, and one-line refusals for what is not converted.

The end-to-end checks (tiny BERT, GPT-2, ViT and LLaMA exported by torch, then optimized by ONNX Runtime's
optimizer) are in ``tests/e2e/test_ort_optimized_models.py``."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tvm_fusion_ext.compile import fuse
from tvm_fusion_ext.errors import ModelLoadError
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.runtime import CompiledModel

ort = pytest.importorskip("onnxruntime")

_TYPES = {np.dtype(np.float32): TP.FLOAT, np.dtype(np.int32): TP.INT32, np.dtype(np.int64): TP.INT64}
B, S, H, N = 2, 5, 16, 2  # batch, sequence, hidden, heads
W_ = "weight"  # marks an input given as an initializer


def _node_model(op, inputs, outputs, attrs=None, domain="com.microsoft", dynamic=()):
    """A graph of one ``op`` node. ``outputs``: names, or ``(name, element type)`` for one not float32.
    ``inputs``: ``[(name, array or None, W_ or "")]`` in the op's input order (None:
    an optional input left out); W_ ones are initializers. Inputs named in ``dynamic`` get symbolic leading dims
    (``batch``, ``seq``; a 1-D one ``mask_len``)."""
    graph_inputs, inits, names = [], [], []
    for name, value, kind in inputs:
        names.append(name if value is not None else "")
        if value is None:
            continue
        if kind == W_:
            inits.append(numpy_helper.from_array(value, name))
            continue
        shape = list(value.shape)
        if name in dynamic:
            shape = ["mask_len"] if value.ndim == 1 else ["batch", "seq", *shape[2:]]
        graph_inputs.append(helper.make_tensor_value_info(name, _TYPES[value.dtype], shape))
    while names and not names[-1]:
        names.pop()
    outputs = [(o, TP.FLOAT) if isinstance(o, str) else o for o in outputs]  # (name, element type)
    node = helper.make_node(op, names, [o for o, _ in outputs], name="n0", domain=domain, **(attrs or {}))
    graph = helper.make_graph([node], op, graph_inputs, [helper.make_tensor_value_info(o, t, None)
                                                         for o, t in outputs if o], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    return m


def _feeds(inputs):
    return {name: value for name, value, kind in inputs if value is not None and kind != W_}


def _check(model, feeds, fused=None, atol=1e-5):
    """Our outputs equal ONNX Runtime's on ``feeds`` (shape, dtype, values); ``fused``: counts the FusionReport
    must show."""
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    mod = load_onnx(model)
    if fused:
        _, report = fuse(mod)
        for key, count in fused.items():
            assert report.fused[key] == count, report.summary()
    got = list(CompiledModel.from_module(mod).run(feeds).values())
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=atol)
    return got


def _refused(model, *fragments):
    with pytest.raises(ModelLoadError) as info:
        load_onnx(model)
    msg = str(info.value)
    assert "\n" not in msg and all(f in msg for f in fragments), msg
    return msg


# ---------------------------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------------------------
_RNG = np.random.default_rng(0)
_X = _RNG.standard_normal((B, S, H)).astype(np.float32)
_W = (_RNG.standard_normal((H, 3 * H)) * 0.5).astype(np.float32)
_BIAS = _RNG.standard_normal(3 * H).astype(np.float32)
_LENGTHS = np.array([S - 2, S], np.int32)
_PADDED = (np.arange(S)[None, :] < _LENGTHS[:, None]).astype(np.int32)           # [B, T]: row 0 padded
_PER_QUERY = (_RNG.random((B, S, S)) > 0.3).astype(np.int32)                       # [B, S, T]
_PER_QUERY[..., 0] = 1
_ATTENTION_BIAS = _RNG.standard_normal((1, N, S, S)).astype(np.float32)

# name: (mask_index, attributes, attention_bias, outputs)
ATTENTION = {
    "no_mask": (None, {}, None, ["y"]),
    "lengths_1d": (_LENGTHS, {}, None, ["y"]),
    # [ends, starts]: keys before the start or at/after the end hidden (row 0 sees keys 1..2, row 1 keys 2..4)
    "ends_and_starts_1d": (np.array([3, 5, 1, 2], np.int32), {}, None, ["y"]),
    # a row whose keys are all hidden is the softmax of its plain scores (the mask adds one constant), not 0
    "all_hidden_1d": (np.array([0, 3], np.int32), {}, None, ["y"]),
    "raw_2d": (_PADDED, {}, None, ["y"]),
    "per_query_3d": (_PER_QUERY, {}, None, ["y"]),
    "causal_padded": (_PADDED, {"unidirectional": 1}, None, ["y"]),
    # a filter value small enough that hidden keys still get weight: it must be the one given
    "scale_and_filter": (_PADDED, {"scale": 0.05, "mask_filter_value": -3.0}, None, ["y"]),
    "attention_bias": (_PADDED, {}, _ATTENTION_BIAS, ["y"]),
    "present": (_PADDED, {}, None, ["y", "present"]),
}


def _attention_inputs(mask, attention_bias=None, weights=_W, bias=_BIAS, x=_X):
    return [("x", x, ""), ("W", weights, W_), ("bias", bias, W_), ("mask_index", mask, ""), ("past", None, ""),
            ("attention_bias", attention_bias, "")]


@pytest.mark.parametrize("case", sorted(ATTENTION))
def test_attention_matches_onnx_runtime_and_fuses(case):
    mask, attrs, attention_bias, outputs = ATTENTION[case]
    inputs = _attention_inputs(mask, attention_bias)
    model = _node_model("Attention", inputs, outputs, {"num_heads": N, **attrs})
    _check(model, _feeds(inputs), fused={"attention": 1, "dense": 1})


@pytest.mark.slow  # 25 s: symbolic attention kernels build their short-request branches
def test_attention_with_symbolic_batch_and_sequence_reads_the_key_counts():
    # the form a dynamic-axes BERT has after the optimizer: EmbedLayerNormalization's [batch] key counts
    inputs = _attention_inputs(_LENGTHS)
    model = _node_model("Attention", inputs, ["y"], {"num_heads": N}, dynamic=("x",))
    model.graph.input[1].type.tensor_type.shape.dim[0].dim_param = "batch"
    _check(model, _feeds(inputs), fused={"attention": 1})
    x3 = _RNG.standard_normal((3, 7, H)).astype(np.float32)
    feeds = {"x": x3, "mask_index": np.array([7, 4, 1], np.int32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = CompiledModel.from_module(load_onnx(model)).run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_attention_with_values_wider_than_keys_and_no_bias():
    widths = (16, 16, 24)
    w = (_RNG.standard_normal((H, sum(widths))) * 0.5).astype(np.float32)
    inputs = _attention_inputs(_PADDED, weights=w, bias=None)
    model = _node_model("Attention", inputs, ["y"], {"num_heads": N, "qkv_hidden_sizes": list(widths)})
    (y,) = _check(model, _feeds(inputs), fused={"attention": 1})
    assert y.shape == (B, S, 24)


@pytest.mark.parametrize("change,match", [
    (dict(past=np.zeros((2, B, N, 3, H // N), np.float32)), "past state (KV cache"),
    (dict(attrs={"do_rotary": 1}), "do_rotary=1"),
    (dict(attrs={"past_present_share_buffer": 1}), "past state (KV cache"),
    (dict(mask=np.ones((B, 1, S, S), np.int32)), "a 4-D mask_index"),
    (dict(mask=np.ones(3 * B + 2, np.int32)), "only the [batch] and [2·batch] forms"),
    (dict(mask=np.ones((B, S + 1), np.int32)), f"mask_index of shape [{B}, {S + 1}], expected [{B}, {S}]"),
    (dict(attrs={"qkv_hidden_sizes": [8, 16, 24]}), "Q and K widths differ (8 and 16)"),
    (dict(attrs={"qkv_hidden_sizes": [8, 8, 8]}), "do not add up to the weights' width 48"),
])
def test_attention_forms_not_converted_are_refused_in_one_line(change, match):
    inputs = _attention_inputs(change.get("mask", _PADDED))
    if "past" in change:
        inputs[4] = ("past", change["past"], "")
    model = _node_model("Attention", inputs, ["y"], {"num_heads": N, **change.get("attrs", {})})
    _refused(model, "op 'com.microsoft.Attention' (node 'n0') is not supported", match)


# ---------------------------------------------------------------------------------------------------------------
# MultiHeadAttention (the optimizer's use_multi_head_attention): the projections' outputs and their merged bias
# ---------------------------------------------------------------------------------------------------------------
_KV_LEN = 7
_Q = _RNG.standard_normal((B, S, H)).astype(np.float32)
_K = _RNG.standard_normal((B, _KV_LEN, H)).astype(np.float32)
_V = _RNG.standard_normal((B, _KV_LEN, H)).astype(np.float32)
_KEY_LENGTHS = np.array([_KV_LEN - 3, _KV_LEN], np.int32)

# name: (key length, key_padding_mask, attention_bias, attributes)
MHA = {
    "self_lengths": (S, _LENGTHS, None, {}),
    "self_raw_causal": (S, _PADDED, None, {"unidirectional": 1}),
    "cross_raw": (_KV_LEN, (np.arange(_KV_LEN)[None] < _KEY_LENGTHS[:, None]).astype(np.int32), None, {}),
    "cross_lengths_bias_scale": (_KV_LEN, _KEY_LENGTHS, _RNG.standard_normal((B, 1, S, _KV_LEN)).astype(np.float32),
                                 {"scale": 0.2}),
}


def _mha_inputs(kv_len, mask, attention_bias, q=_Q, k=_K, v=_V):
    return [("q", q, ""), ("k", k[:, :kv_len].copy() if k is not None else None, ""),
            ("v", v[:, :kv_len].copy() if v is not None else None, ""), ("bias", _BIAS, W_),
            ("key_padding_mask", mask, ""), ("attention_bias", attention_bias, "")]


@pytest.mark.parametrize("case", sorted(MHA))
def test_multi_head_attention_matches_onnx_runtime_and_fuses(case):
    kv_len, mask, attention_bias, attrs = MHA[case]
    inputs = _mha_inputs(kv_len, mask, attention_bias)
    model = _node_model("MultiHeadAttention", inputs, ["y"], {"num_heads": N, **attrs})
    _check(model, _feeds(inputs), fused={"attention": 1})


@pytest.mark.parametrize("change,match", [
    (dict(outputs=["y", "present_key", "present_value"]), "present_key/present_value/qk outputs"),
    (dict(q=_RNG.standard_normal((B, S, N, 3, H // N)).astype(np.float32), k=None, v=None), "packed QKV/KV"),
    (dict(mask=np.ones(2 * B, np.int32)), "only the [batch] form is supported"),
])
def test_multi_head_attention_forms_not_converted_are_refused(change, match):
    inputs = _mha_inputs(S, change.get("mask", _LENGTHS), None, q=change.get("q", _Q), k=change.get("k", _K),
                         v=change.get("v", _V))
    model = _node_model("MultiHeadAttention", inputs, change.get("outputs", ["y"]), {"num_heads": N})
    _refused(model, "op 'com.microsoft.MultiHeadAttention' (node 'n0') is not supported", match)


# ---------------------------------------------------------------------------------------------------------------
# SkipLayerNormalization, SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization
# ---------------------------------------------------------------------------------------------------------------
_SKIP = _RNG.standard_normal((B, S, H)).astype(np.float32)
_GAMMA = _RNG.standard_normal(H).astype(np.float32)
_BETA = _RNG.standard_normal(H).astype(np.float32)
_NORM_BIAS = _RNG.standard_normal(H).astype(np.float32)


@pytest.mark.parametrize("beta,bias,skip,outputs,attrs", [
    # every output: the residual sum a pre-norm model reads next (TVM's converter gave a scalar 0 for it)
    (_BETA, _NORM_BIAS, _SKIP, ["y", "mean", "inv_std_var", "sum"], {"epsilon": 1e-5}),
    (None, None, _SKIP, ["y", "", "", "sum"], {}),          # no beta, no bias (TVM's converter asserted both)
    (_BETA, None, _SKIP[0], ["y"], {}),                      # a [S, H] skip broadcast over the batch
])
def test_skip_layer_norm_matches_onnx_runtime_and_fuses(beta, bias, skip, outputs, attrs):
    inputs = [("x", _X, ""), ("skip", skip, ""), ("gamma", _GAMMA, W_), ("beta", beta, W_), ("bias", bias, W_)]
    model = _node_model("SkipLayerNormalization", inputs, outputs, attrs)
    _check(model, _feeds(inputs), fused={"layernorm": 1})


@pytest.mark.parametrize("bias,outputs", [(_NORM_BIAS, ["y", "", "inv_std_var", "sum"]), (None, ["y"])])
def test_skip_simplified_layer_norm_matches_onnx_runtime_and_fuses(bias, outputs):
    # ONNX Runtime 1.32 adds the bias into the sum it returns
    inputs = [("x", _X, ""), ("skip", _SKIP, ""), ("gamma", _GAMMA, W_), ("bias", bias, W_)]
    model = _node_model("SkipSimplifiedLayerNormalization", inputs, outputs, {"epsilon": 1e-6})
    _check(model, _feeds(inputs), fused={"rmsnorm": 1})


def test_simplified_layer_norm_in_the_onnx_domain_matches_onnx_runtime():
    inputs = [("x", _X, ""), ("gamma", _GAMMA, W_)]
    model = _node_model("SimplifiedLayerNormalization", inputs, ["y", "inv_std_var"], {"axis": -1}, domain="")
    _check(model, _feeds(inputs), fused={"rmsnorm": 1})


def test_norm_outputs_onnx_runtime_does_not_compute_are_refused():
    inputs = [("x", _X, ""), ("skip", _SKIP, ""), ("gamma", _GAMMA, W_)]
    model = _node_model("SkipSimplifiedLayerNormalization", inputs, ["y", "mean"])
    _refused(model, "op 'com.microsoft.SkipSimplifiedLayerNormalization' (node 'n0') is not supported",
             "the mean output")


# ---------------------------------------------------------------------------------------------------------------
# EmbedLayerNormalization
# ---------------------------------------------------------------------------------------------------------------
_VOCAB, _POSITIONS = 30, 12
_WORD = _RNG.standard_normal((_VOCAB, H)).astype(np.float32)
_POSITION = _RNG.standard_normal((_POSITIONS, H)).astype(np.float32)
_SEGMENT = _RNG.standard_normal((2, H)).astype(np.float32)
_IDS = _RNG.integers(0, _VOCAB, (B, S)).astype(np.int32)
_SEGMENT_IDS = _RNG.integers(0, 2, (B, S)).astype(np.int32)
_EMBED_MASK = _PADDED.copy()
_EMBED_MASK[1, 1] = 2  # ONNX Runtime counts the entries equal to 1: this one is not counted


def _embed_inputs(segments=True, mask=_EMBED_MASK, position_ids=None):
    return [("input_ids", _IDS, ""), ("segment_ids", _SEGMENT_IDS if segments else None, ""),
            ("word", _WORD, W_), ("position", _POSITION, W_), ("segment", _SEGMENT if segments else None, W_),
            ("gamma", _GAMMA, W_), ("beta", _BETA, W_), ("mask", mask, ""), ("position_ids", position_ids, "")]


@pytest.mark.parametrize("kwargs,outputs", [
    (dict(), ["y", ("mask_index", TP.INT32), "embedding_sum"]),
    (dict(segments=False, mask=None), ["y", ("mask_index", TP.INT32)]),           # no mask: zeros
    (dict(position_ids=np.array([[3, 1, 4, 1, 5]], np.int32)), ["y", ("mask_index", TP.INT32)]),  # [1, S]
])
def test_embed_layer_norm_matches_onnx_runtime_and_fuses_its_layer_norm(kwargs, outputs):
    inputs = _embed_inputs(**kwargs)
    model = _node_model("EmbedLayerNormalization", inputs, outputs, {"epsilon": 1e-5})
    _check(model, _feeds(inputs), fused={"layernorm": 1})


def test_embed_layer_norm_with_symbolic_batch_and_sequence():
    # TVM's converter read every dim as a number and failed on a dynamic-axes export
    inputs = _embed_inputs()
    model = _node_model("EmbedLayerNormalization", inputs, ["y", ("mask_index", TP.INT32)],
                        dynamic=("input_ids", "segment_ids", "mask"))
    _check(model, _feeds(inputs))


def test_embed_layer_norm_refuses_token_ids_past_the_table_at_run_time():
    from tvm_fusion_ext.errors import InputError

    inputs = _embed_inputs()
    compiled = CompiledModel.from_module(load_onnx(_node_model("EmbedLayerNormalization", inputs, ["y"])))
    feeds = _feeds(inputs)
    feeds["input_ids"] = feeds["input_ids"].copy()
    feeds["input_ids"][0, 0] = _VOCAB
    with pytest.raises(InputError, match="input 'input_ids' holds 1 value outside"):
        compiled.run(feeds)


# ---------------------------------------------------------------------------------------------------------------
# activations, BiasAdd, FusedMatMul
# ---------------------------------------------------------------------------------------------------------------
_DENSE_W = (_RNG.standard_normal((H, 24)) * 0.3).astype(np.float32)
_DENSE_B = _RNG.standard_normal(24).astype(np.float32)
_HIDDEN = _RNG.standard_normal((B, S, 24)).astype(np.float32) * 2


@pytest.mark.parametrize("op,inputs,attrs,activation", [
    ("Gelu", [("h", _HIDDEN, "")], {}, "gelu"),
    ("BiasGelu", [("h", _HIDDEN, ""), ("b", _DENSE_B, W_)], {}, "gelu"),
    ("FastGelu", [("h", _HIDDEN, ""), ("b", _DENSE_B, W_)], {}, "gelu_tanh"),
    ("FastGelu", [("h", _HIDDEN, "")], {}, "gelu_tanh"),
    ("QuickGelu", [("h", _HIDDEN, "")], {}, None),                    # alpha 1.702: x·sigmoid(1.702·x)
    ("QuickGelu", [("h", _HIDDEN, "")], {"alpha": 1.0}, "silu"),      # SiLU, as the optimizer writes LLaMA's
])
def test_activations_match_onnx_runtime(op, inputs, attrs, activation):
    model = _node_model(op, inputs, ["y"], attrs)
    _check(model, _feeds(inputs))
    if activation is not None:  # the activation the dense rule reads after a projection
        import tvm

        mod = load_onnx(model)
        ops = {b.value.op.name for b in mod["main"].body.blocks[0].bindings if isinstance(b.value, tvm.relax.Call)}
        assert f"relax.nn.{activation}" in ops, ops


def test_bias_add_is_the_sum_of_its_three_inputs():
    # ONNX Runtime has a CUDA kernel only (its optimizer writes BiasAdd for GPU UNets): checked against numpy
    skip = _HIDDEN[::-1].copy()
    inputs = [("h", _HIDDEN, ""), ("b", _DENSE_B, W_), ("skip", skip, "")]
    got = CompiledModel.from_module(load_onnx(_node_model("BiasAdd", inputs, ["y"]))).run(_feeds(inputs))["y"]
    np.testing.assert_allclose(got, _HIDDEN + _DENSE_B + skip, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("a,b,attrs", [
    (_X, _DENSE_W.T.copy(), {"transB": 1, "alpha": 0.5}),
    (_X.transpose(0, 2, 1).copy(), _DENSE_W, {"transA": 1}),
    (_X, _DENSE_W, {}),
])
def test_fused_matmul_matches_onnx_runtime(a, b, attrs):
    inputs = [("a", a, ""), ("b", b, W_)]
    _check(_node_model("FusedMatMul", inputs, ["y"], attrs), _feeds(inputs), fused={"dense": 1})


def test_projection_then_fast_gelu_fuses_into_one_dense():
    from onnx import helper as h

    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]),
             h.make_node("FastGelu", ["m", "b"], ["y"], domain="com.microsoft")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [B, S, H])],
                         [h.make_tensor_value_info("y", TP.FLOAT, None)],
                         [numpy_helper.from_array(_DENSE_W, "w"), numpy_helper.from_array(_DENSE_B, "b")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    _check(model, {"x": _X}, fused={"dense": 1})


# ---------------------------------------------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------------------------------------------
def test_fused_matmul_batch_transposes_are_refused():
    inputs = [("a", _X, ""), ("b", _DENSE_W, W_)]
    _refused(_node_model("FusedMatMul", inputs, ["y"], {"transBatchA": 1}),
             "op 'com.microsoft.FusedMatMul' (node 'n0') is not supported", "transBatchA=1")


def test_contrib_ops_without_a_converter_are_refused_naming_the_op_and_node():
    inputs = [("query", _X, ""), ("key", _X, ""), ("value", _X, "")]
    msg = _refused(_node_model("GroupQueryAttention", inputs, ["y"], {"num_heads": N, "kv_num_heads": N}),
                   "op 'com.microsoft.GroupQueryAttention' (node 'n0') is not supported",
                   "ONNX Runtime contrib op with no converter here")
    assert "Attention, BiasAdd" in msg


def test_nchwc_layout_ops_of_opt_level_99_are_refused_with_the_remedy():
    inputs = [("x", _RNG.standard_normal((1, 8, 4, 4)).astype(np.float32), "")]
    model = _node_model("ReorderInput", inputs, ["y"], domain="com.microsoft.nchwc")
    _refused(model, "op 'com.microsoft.nchwc.ReorderInput' (node 'n0') is not supported",
             "optimize with opt_level 2 or lower")


def test_a_contrib_op_name_in_the_onnx_domain_is_still_refused():
    # the name alone does not make a node ONNX Runtime's op: SkipLayerNormalization is com.microsoft's
    inputs = [("x", _X, ""), ("skip", _SKIP, ""), ("gamma", _GAMMA, W_)]
    _refused(_node_model("SkipLayerNormalization", inputs, ["y"], domain=""),
             "op 'SkipLayerNormalization' (node 'n0') is not supported")


# ---------------------------------------------------------------------------------------------------------------
# ONNX Runtime's own graph rewrites (opt_level >= 1), beside the contrib ops
# ---------------------------------------------------------------------------------------------------------------
def test_a_shape_gathered_by_a_permutation_stays_a_shape_for_reshape():
    # ONNX Runtime's transpose optimizer writes Shape(Transpose(x)) as Gather(Shape(x), perm); the stock converter made
    # it a run-time tensor and the Reshape reading it was refused (dynamic-axes dynamo exports at opt_level 1)
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "perm"], ["ps"], axis=0),
             helper.make_node("Reshape", ["x", "ps"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["a", "b", 4])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                              [numpy_helper.from_array(np.array([2, 0, -2], np.int64), "perm")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    from tvm_fusion_ext.frontend.converters.common import dim_text

    mod = load_onnx(model)
    assert [dim_text(d) for d in mod["main"].ret_ty.shape.values] == ["4", "a", "b"]
    (y,) = _check(model, {"x": _RNG.standard_normal((2, 3, 4)).astype(np.float32)})
    assert y.shape == (4, 2, 3)


def test_rotate_half_written_as_one_split_fuses_as_rotary():
    # ONNX Runtime's opt_level 2 writes rotate-half's two last-axis Slices as one Split (LLaMA optimized as gpt2):
    # the rotary rule reads the split's parts as the halves (rope 0 before, the rotation left elementwise)
    d = 8
    cos = np.cos(np.arange(S)[:, None] * np.arange(d)[None, :] * 0.3).astype(np.float32)
    sin = np.sin(np.arange(S)[:, None] * np.arange(d)[None, :] * 0.3).astype(np.float32)
    nodes = [helper.make_node("Split", ["x", "halves"], ["x1", "x2"], axis=-1),
             helper.make_node("Neg", ["x2"], ["neg"]), helper.make_node("Concat", ["neg", "x1"], ["rot"], axis=-1),
             helper.make_node("Mul", ["x", "cos"], ["a"]), helper.make_node("Mul", ["rot", "sin"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [B, N, S, d])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                              [numpy_helper.from_array(np.array([d // 2, d // 2], np.int64), "halves"),
                               numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    _check(model, {"x": _RNG.standard_normal((B, N, S, d)).astype(np.float32)}, fused={"rope": 1})
