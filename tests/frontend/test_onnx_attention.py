"""ONNX's own ``Attention`` op (opsets 23-25; ``frontend/converters/attention.py``): numerics against ONNX's reference
evaluator for every attribute family, fusion where the meaning is plain attention, no fusion where the graph reads the
scores or caps them, and one-line refusals.

torch's dynamo exporter writes ``scaled_dot_product_attention`` as this op from opset 23 on; the end-to-end check
(a BERT and a grouped-query LLaMA exported at opset 23) is in ``tests/e2e/test_opset23_exports.py``."""

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

F32, BOOL, I64 = TP.FLOAT, TP.BOOL, TP.INT64
_NP = {F32: np.float32, BOOL: np.bool_, I64: np.int64}

# name: (opset, inputs as (name, elem type, shape) with "" for an omitted optional input, attributes,
#        number of outputs, fuses into one fused_attention)
CASES = {
    "mha": (23, [("q", F32, [2, 4, 6, 8]), ("k", F32, [2, 4, 6, 8]), ("v", F32, [2, 4, 6, 8])], {}, 1, True),
    "gqa_causal": (23, [("q", F32, [2, 4, 6, 8]), ("k", F32, [2, 2, 6, 8]), ("v", F32, [2, 2, 6, 8])],
                   {"is_causal": 1}, 1, True),
    # 3-D hidden states split by the head counts; a boolean padding mask, one batch row with every key hidden
    "bool_mask_3d": (23, [("q", F32, [2, 6, 32]), ("k", F32, [2, 5, 16]), ("v", F32, [2, 5, 16]),
                          ("mask", BOOL, [2, 1, 1, 5])], {"q_num_heads": 4, "kv_num_heads": 2}, 1, True),
    "float_mask_scale": (23, [("q", F32, [2, 4, 5, 8]), ("k", F32, [2, 4, 7, 8]), ("v", F32, [2, 4, 7, 8]),
                              ("mask", F32, [5, 7])], {"scale": 0.3}, 1, True),
    # a cache in front: the causal frontier is offset by its length, the present K/V are outputs
    "past_causal": (23, [("q", F32, [1, 4, 3, 8]), ("k", F32, [1, 4, 3, 8]), ("v", F32, [1, 4, 3, 8]), ("", 0, []),
                         ("pk", F32, [1, 4, 5, 8]), ("pv", F32, [1, 4, 5, 8])], {"is_causal": 1}, 3, True),
    "short_mask": (23, [("q", F32, [1, 2, 4, 8]), ("k", F32, [1, 2, 6, 8]), ("v", F32, [1, 2, 6, 8]),
                        ("mask", BOOL, [1, 1, 4, 4])], {}, 1, True),
    # values wider than the keys: the operator's output takes V's head dim (refused once, now converted)
    "value_width": (23, [("q", F32, [1, 2, 4, 8]), ("k", F32, [1, 2, 5, 8]), ("v", F32, [1, 2, 5, 12])], {}, 1,
                    True),
    # capped scores, then the causal bias: the operator's soft-capping (Gemma 2's order)
    "softcap": (23, [("q", F32, [1, 2, 4, 8]), ("k", F32, [1, 2, 4, 8]), ("v", F32, [1, 2, 4, 8])],
                {"softcap": 3.0, "is_causal": 1}, 1, True),
    # the graph reads the probabilities: they must exist
    "probs_output": (23, [("q", F32, [1, 2, 4, 8]), ("k", F32, [1, 2, 4, 8]), ("v", F32, [1, 2, 4, 8])],
                     {"qk_matmul_output_mode": 3}, 4, False),
    "scores_output": (23, [("q", F32, [1, 2, 4, 8]), ("k", F32, [1, 2, 4, 8]), ("v", F32, [1, 2, 4, 8]),
                           ("mask", F32, [1, 1, 4, 4])], {"qk_matmul_output_mode": 2}, 4, False),
    # per-batch valid key counts (a static cache): causal from each row's own end, padding keys hidden
    "nonpad_causal": (24, [("q", F32, [2, 2, 3, 8]), ("k", F32, [2, 2, 6, 8]), ("v", F32, [2, 2, 6, 8]),
                           ("", 0, []), ("", 0, []), ("", 0, []), ("nonpad", I64, [2])], {"is_causal": 1}, 1, True),
    "window": (25, [("q", F32, [1, 2, 6, 8]), ("k", F32, [1, 2, 6, 8]), ("v", F32, [1, 2, 6, 8])],
               {"is_causal": 1, "left_window_size": 2}, 1, True),
}
_OUTS = ("y", "present_key", "present_value", "qk")


def _model(case):
    opset, ins, attrs, n_out, _ = CASES[case]
    node = helper.make_node("Attention", [n for n, _, _ in ins], list(_OUTS[:n_out]), **attrs)
    graph = helper.make_graph([node], case, [helper.make_tensor_value_info(n, t, s) for n, t, s in ins if n],
                              [helper.make_tensor_value_info(o, F32, None) for o in _OUTS[:n_out]])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def _feeds(case, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, t, shape in CASES[case][1]:
        if not name:
            continue
        if t == BOOL:
            m = rng.random(shape) > 0.3
            m[..., 0] = True
            if case == "bool_mask_3d":
                m[1] = False  # every key of batch row 1 hidden: its output is 0 by the spec
            feeds[name] = m
        elif t == I64:
            feeds[name] = np.array([4, 6], np.int64)
        else:
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


@pytest.mark.parametrize("case", sorted(CASES))
def test_onnx_attention_matches_onnx_reference_and_fuses_where_it_means_attention(case):
    m = _model(case)
    mod = load_onnx(m)
    _, report = fuse(mod)
    assert report.fused["attention"] == int(CASES[case][4]), report.summary()
    feeds = _feeds(case)
    ref = ReferenceEvaluator(m).run(None, feeds)
    got = CompiledModel.from_module(mod).run(feeds)
    for name, want in zip(_OUTS, ref):
        assert got[name].shape == want.shape, name
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5, err_msg=f"{case}: {name}")
    if case == "bool_mask_3d":
        assert not np.isnan(got["y"]).any() and np.all(got["y"][1] == 0)


def test_grouped_causal_attention_reads_kv_unrepeated_with_the_operators_causal_flag():
    # the bottom-right causal bias of equal lengths is the operator's own causal mode (no S x T constant is left),
    # and the repeated K/V heads are read in place
    import tvm

    from tvm_fusion_ext.ops import params_of

    fused, _ = fuse(load_onnx(_model("gqa_causal")))
    (func,) = [f for _, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
               and f.attrs is not None and f.attrs.get("tfx.op") == "fused_attention"]
    assert params_of(func)["causal"] is True
    assert [int(d) for d in func.params[1].ty.shape] in ([2, 6, 2, 8], [2, 2, 6, 8])


@pytest.mark.parametrize("attrs,inputs,match", [
    ({}, [("q", F32, [2, 6, 32]), ("k", F32, [2, 5, 16]), ("v", F32, [2, 5, 16])], "q_num_heads and kv_num_heads"),
    ({"q_num_heads": 5, "kv_num_heads": 2}, [("q", F32, [2, 6, 32]), ("k", F32, [2, 5, 16]), ("v", F32, [2, 5, 16])],
     "not a static multiple of its 5 heads"),
    ({}, [("q", F32, [1, 3, 4, 8]), ("k", F32, [1, 2, 4, 8]), ("v", F32, [1, 2, 4, 8])],
     "3 query heads cannot share 2 K/V heads"),
    ({}, [("q", F32, [1, 2, 4, 8]), ("k", F32, [1, 2, 4, 8]), ("v", F32, [1, 2, 4, 8]), ("mask", F32, [1, 1, 4, 6])],
     "attn_mask's key dim 6 is not the key count 4"),
])
def test_unsupported_forms_are_refused_in_one_line(attrs, inputs, match):
    node = helper.make_node("Attention", [n for n, _, _ in inputs], ["y"], name="attn", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info("y", F32, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 10
    with pytest.raises(ModelLoadError) as info:
        load_onnx(m)
    msg = str(info.value)
    assert "\n" not in msg and "op 'Attention' (node 'attn')" in msg and match in msg, msg
