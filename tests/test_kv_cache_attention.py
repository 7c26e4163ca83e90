"""Attention over a KV cache whose key and value lengths the export names apart.

torch's dynamo exporter, given a decoder with ``past_key_values`` and automatic dims, names ``past_key``'s and
``past_value``'s lengths as two symbols, and turns the past length into positions (``Range`` from
``Shape(past_key)[2]``). Two things broke on such a file: the attention rule refused (``k has P + S keys, v has
Q + S``) although the second matmul makes them equal whenever the graph runs, and the build died inside TVM
(``FuseTIR``'s ``RenewDefs``) on a fused group that read the past length only as a scalar. Now the attention fuses
with v match-cast to k's key count (checked at run time, with a one-line error naming the inputs' dims), and a
kernel that reads a dim only as a scalar stays out of fused groups (``compile/lowering/scalar_calls.py``).

The e2e versions (tiny LLaMA and GPT-2 with a cache, both exporters) are in ``tests/e2e/test_kv_cache_decoders.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tvm_fusion_ext.compile import fuse
from tvm_fusion_ext.compile.lowering.scalar_calls import scalar_only_callees
from tvm_fusion_ext.deploy.io import shape_check_error
from tvm_fusion_ext.errors import InputError
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.runtime import CompiledModel

H, D = 2, 8


def _cached_attention():
    """``softmax(q·[past_k, k]ᵀ / √D) · [past_v, v] + 0.01 · position``, positions ``past_len .. past_len + S - 1``
    from ``Shape(past_k)[2]``; ``past_k`` and ``past_v`` lengths are the separate dims ``pk`` and ``pv``."""
    nodes = [
        helper.make_node("Concat", ["past_k", "k"], ["keys"], axis=2),
        helper.make_node("Concat", ["past_v", "v"], ["values"], axis=2),
        helper.make_node("Transpose", ["keys"], ["keys_t"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "keys_t"], ["scores"]),
        helper.make_node("Div", ["scores", "sqrt_d"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "values"], ["attn"]),
        helper.make_node("Shape", ["past_k"], ["pk_shape"]),
        helper.make_node("Gather", ["pk_shape", "two"], ["past_len"], axis=0),
        helper.make_node("Shape", ["q"], ["q_shape"]),
        helper.make_node("Gather", ["q_shape", "two"], ["new_len"], axis=0),
        helper.make_node("Add", ["past_len", "new_len"], ["end"]),
        helper.make_node("Range", ["past_len", "end", "one"], ["positions"]),
        helper.make_node("Cast", ["positions"], ["positions_f"], to=TP.FLOAT),
        helper.make_node("Reshape", ["positions_f", "column"], ["position_column"]),
        helper.make_node("Mul", ["position_column", "hundredth"], ["offset"]),
        helper.make_node("Add", ["attn", "offset"], ["out"]),
    ]
    inits = [numpy_helper.from_array(np.asarray(np.sqrt(D), np.float32), "sqrt_d"),
             numpy_helper.from_array(np.asarray(2, np.int64), "two"),
             numpy_helper.from_array(np.asarray(1, np.int64), "one"),
             numpy_helper.from_array(np.asarray([1, 1, -1, 1], np.int64), "column"),
             numpy_helper.from_array(np.asarray(0.01, np.float32), "hundredth")]
    inputs = [helper.make_tensor_value_info("q", TP.FLOAT, ["b", H, "s", D]),
              helper.make_tensor_value_info("k", TP.FLOAT, ["b", H, "s", D]),
              helper.make_tensor_value_info("v", TP.FLOAT, ["b", H, "s", D]),
              helper.make_tensor_value_info("past_k", TP.FLOAT, ["b", H, "pk", D]),
              helper.make_tensor_value_info("past_v", TP.FLOAT, ["b", H, "pv", D])]
    graph = helper.make_graph(nodes, "cached_attention", inputs,
                              [helper.make_tensor_value_info("out", TP.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds(b, s, past, past_v=None, seed=0):
    rng = np.random.default_rng(seed)

    def t(n):
        return rng.standard_normal((b, H, n, D)).astype(np.float32)

    return {"q": t(s), "k": t(s), "v": t(s), "past_k": t(past), "past_v": t(past if past_v is None else past_v)}


def _reference(f):
    keys = np.concatenate([f["past_k"], f["k"]], axis=2)
    values = np.concatenate([f["past_v"], f["v"]], axis=2)
    scores = f["q"] @ keys.transpose(0, 1, 3, 2) / np.sqrt(D)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    past = f["past_k"].shape[2]
    positions = np.arange(past, past + f["q"].shape[2], dtype=np.float32).reshape(1, 1, -1, 1)
    return probs @ values + 0.01 * positions


def test_kv_cache_attention_fuses_with_key_and_value_lengths_named_apart():
    mod = load_onnx(_cached_attention())
    _, report = fuse(mod)
    assert report.fused["attention"] == 1, report.summary()
    assert "v has" not in report.summary()
    model = CompiledModel.from_module(mod)
    for b, s, past in ((1, 1, 7), (2, 3, 5), (3, 4, 1)):
        f = _feeds(b, s, past, seed=b * 10 + past)
        np.testing.assert_allclose(model.run(f)["out"], _reference(f), rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # 8.5 s
def test_cached_lengths_that_differ_are_refused_in_one_line():
    model = CompiledModel.from_module(load_onnx(_cached_attention()))
    with pytest.raises(InputError) as err:
        model.run(_feeds(2, 3, past=5, past_v=4))
    text = str(err.value)
    assert "\n" not in text
    assert "the inputs' shapes do not fit together" in text and "has 7 at dim 2, where the inputs give 8" in text
    assert "pk = 5 from 'past_k' dim 2" in text and "s = 3 from 'q' dim 2" in text


def test_the_unfused_graph_builds_too_and_refuses_the_same_way():
    # the build failure was TVM's own, with no fusion of ours involved
    model = CompiledModel.from_module(load_onnx(_cached_attention()), fuse=False)
    f = _feeds(2, 3, 5, seed=3)
    np.testing.assert_allclose(model.run(f)["out"], _reference(f), rtol=1e-5, atol=1e-5)
    with pytest.raises(InputError, match="the inputs' shapes do not fit together"):
        model.run(_feeds(2, 3, past=5, past_v=6))


def test_a_kernel_reading_a_dim_only_as_a_scalar_is_kept_out_of_fused_groups():
    import tvm
    from tvm import relax

    from tvm_fusion_ext.transform.shape_computations import ResolveShapeComputations

    mod = load_onnx(_cached_attention())
    with tvm.target.Target({"kind": "llvm"}):
        lowered = tvm.transform.Sequential([ResolveShapeComputations(), relax.transform.LegalizeOps()])(mod)
    names = scalar_only_callees(lowered)
    # Range(past_len, past_len + s): an arange of s elements that reads past_len as a scalar (without this,
    # FuseTIR stops in RenewDefs on this very graph)
    assert "arange" in names, names
    # kernels whose scalar dims their buffers' shapes also hold (broadcasts, reshapes) are left to FuseOps
    assert not any(n.startswith(("broadcast_to", "reshape")) for n in names), names


def test_other_vm_errors_are_not_rewritten_as_shape_errors():
    specs = {"x": (("n", 4), "float32")}
    assert shape_check_error(RuntimeError("CUDA out of memory"), specs, {"x": np.zeros((2, 4))}) is None
    vm_text = ("Check failed: input_shape[i] == heap_data[reg] (7 vs. 8) : ErrorContext(match_cast, "
               "ty=R.Tensor((n, 4), dtype=\"float32\"))  match_cast error,  shape[0] mismatch to a previous "
               "populated value.")
    err = shape_check_error(RuntimeError(vm_text), specs, {"x": np.zeros((2, 4))}, label="m.onnx")
    assert str(err) == ("m.onnx: the inputs' shapes do not fit together: a tensor of shape (n, 4) the model computes "
                        "has 7 at dim 0, where the inputs give 8 (n = 2 from 'x' dim 0)")


def test_shape_error_prints_dims_as_a_user_reads_them():
    # a sliding-window cache's length, as TVM prints it: T.min / T.max and INT64_MAX's digits, T.int64(7)
    specs = {"past": (("b", 2, "past", 16), "float32")}
    vm_text = ("Check failed: (10 vs. 8) : ErrorContext(match_cast, ty=R.Tensor((b, 1, T.min(9223372036854775807, "
               "past) - T.min(T.max(past - T.int64(7), 0), past) + 1), dtype=\"float32\"))  match_cast error,  "
               "shape[2] mismatch to a previous populated value.")
    err = shape_check_error(RuntimeError(vm_text), specs, {"past": np.zeros((1, 2, 9, 16))}, label="m.onnx")
    assert "(b, 1, min(INT64_MAX, past) - min(max(past - 7, 0), past) + 1)" in str(err), err
    assert "T." not in str(err) and "past = 9 from 'past' dim 2" in str(err), err
