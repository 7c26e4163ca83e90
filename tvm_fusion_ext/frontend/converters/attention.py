"""ONNX's own ``Attention`` op (opsets 23–25), written out as the graph :class:`FuseMultiHeadAttention` reads.

torch's dynamo exporter emits it for ``scaled_dot_product_attention`` from opset 23 on (with
``RMSNormalization`` and ``Gelu`` beside it); TVM 0.27 has no converter for it (its ``Attention`` is ONNX
Runtime's ``com.microsoft.Attention``, a different op that happens to share the name).

Why written out rather than mapped onto ``fused_attention`` directly: the unfused form is correct on its own for
every attribute combination, and whether it becomes one operator is then the fusion rule's decision, made with
the same checks (layouts, masks, causal detection, grouped K/V heads) as for every other exporter's spelling.
The form is the one SDPA exports have:

    q, k, v      4-D ``[B, H, S, D]``; 3-D ``[B, S, H·D]`` inputs split by ``q_num_heads`` / ``kv_num_heads``
    k, v         ``past_key`` / ``past_value`` concatenated in front (``present_*`` outputs)
    k, v         grouped heads repeated as ``repeat_kv`` does (head h reads K/V head h // (H / Hkv))
    scores       ``matmul(q, kᵀ) · scale`` (default ``1/sqrt(D)``), then ``softcap · tanh(scores / softcap)``
    bias         the mask (boolean: ``where(m, 0, -inf)``), the causal bias (key j visible from query i when
                 j <= i + offset: the cached length, or per batch ``nonpad_kv_seqlen - S``), the sliding window,
                 the key padding of ``nonpad_kv_seqlen``: each added to the scores
    y            ``matmul(where(isnan(p), 0, p), v)`` with ``p = softmax(scores + bias)`` (in
                 ``softmax_precision``): a query row that sees no key gives 0, as the spec says

The optional ``qk_matmul_output`` is the scores as ONNX's reference takes them (modes 0 and 1: scaled and capped,
2: with the bias, 3: the probabilities); a graph that reads it keeps this attention unfused.

Refused with a reason: a 3-D input without its head counts or with a hidden size
they do not divide, head dims or a default scale that are not static, and a mask whose key dim differs from the
keys' (shorter masks are padded with hidden keys only when both lengths are static).
"""

from __future__ import annotations

import math
from typing import List

import numpy as np

from ..errors import Unsupported
from .common import dim_text, is_static

_RANK_3D, _RANK_4D = 3, 4


def convert_onnx_attention(bb, inputs, attr):
    """Relax expression (a tuple when ``present_key``/``present_value`` are requested) for one Attention node."""
    from tvm import relax

    inputs = list(inputs) + [None] * (7 - len(inputs))
    q, k, v, mask, past_k, past_v, nonpad = (bb.normalize(x) if x is not None else None for x in inputs[:7])
    n_out = int(attr.get("tvm_custom", {}).get("num_outputs", 1))
    mode = int(attr.get("qk_matmul_output_mode", 0))
    if n_out > 3 and mode not in (0, 1, 2, 3):
        raise Unsupported(f"qk_matmul_output_mode {mode} is not one of 0-3")
    if (past_k is None) != (past_v is None):
        raise Unsupported("past_key and past_value must be given together")
    if nonpad is not None and past_k is not None:
        raise Unsupported("nonpad_kv_seqlen cannot be combined with past_key/past_value")
    rank = _rank(q)
    if rank != _rank(k) or rank != _rank(v) or rank not in (_RANK_3D, _RANK_4D):
        raise Unsupported(f"Q, K and V must all be 3-D or all 4-D, got ranks {_rank(q)}, {_rank(k)}, {_rank(v)}")
    dtype = str(q.ty.dtype)
    if rank == _RANK_3D:
        q_heads, kv_heads = attr.get("q_num_heads"), attr.get("kv_num_heads")
        if q_heads is None or kv_heads is None:
            raise Unsupported("3-D Q/K/V need the q_num_heads and kv_num_heads attributes")
        q, k, v = (_split_heads(bb, x, int(h), name) for x, h, name in
                   ((q, q_heads, "Q"), (k, kv_heads, "K"), (v, kv_heads, "V")))
    else:
        for key, x in (("q_num_heads", q), ("kv_num_heads", k)):
            if key in attr and not _equal(_dims(x)[1], int(attr[key])):
                raise Unsupported(f"{key}={attr[key]} disagrees with the 4-D input's head axis {dim_text(_dims(x)[1])}")

    present_k = bb.emit(relax.op.concat([past_k, k], axis=2)) if past_k is not None else k
    present_v = bb.emit(relax.op.concat([past_v, v], axis=2)) if past_v is not None else v
    q_len, kv_len = _dims(q)[2], _dims(present_k)[2]
    head_dim = _dims(q)[3]

    scale = attr.get("scale")
    if scale is None:
        if not is_static(head_dim):
            raise Unsupported("the default scale 1/sqrt(head size) needs a static head size")
        scale = 1.0 / math.sqrt(int(head_dim))
    k_all, v_all = (_repeat_kv(bb, x, _dims(q)[1]) for x in (present_k, present_v))

    scores = bb.emit(relax.op.matmul(q, relax.op.permute_dims(k_all, [0, 1, 3, 2])))
    scores = bb.emit(relax.op.multiply(scores, relax.const(float(scale), dtype)))
    softcap = float(attr.get("softcap", 0.0) or 0.0)
    if softcap > 0:  # before the bias, so hidden keys stay -inf
        capped = relax.op.tanh(relax.op.divide(scores, relax.const(softcap, dtype)))
        scores = bb.emit(relax.op.multiply(capped, relax.const(softcap, dtype)))

    scores_out = scores  # modes 0 and 1: scaled (and capped) q·kᵀ, as ONNX's reference gives it
    bias = _bias(bb, attr, mask, dtype, q_len, kv_len, past_k, nonpad)
    if bias is not None:
        scores = bb.emit(relax.op.add(scores, bias))
    if mode == 2:
        scores_out = scores
    precision = attr.get("softmax_precision")
    stash = _onnx_dtype(precision) if precision is not None else dtype
    if stash != dtype:
        scores = bb.emit(relax.op.astype(scores, stash))
    probs = bb.emit(relax.op.nn.softmax(scores, axis=-1))
    if bias is not None:  # a row with every key hidden: NaN from softmax, 0 by the spec
        probs = bb.emit(relax.op.where(relax.op.isnan(probs), relax.const(0.0, stash), probs))
    if stash != dtype:
        probs = bb.emit(relax.op.astype(probs, dtype))
    if mode == 3:
        scores_out = probs
    y = bb.emit(relax.op.matmul(probs, v_all))
    if rank == _RANK_3D:
        b, h, s, dv = _dims(y)
        y = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(y, [0, 2, 1, 3])), [b, s, h * dv]))
    if n_out == 1:
        return y
    # the cache outputs are 4-D for 3-D inputs too; reading the scores keeps this attention unfused (they leak)
    return relax.Tuple([y, present_k, present_v, scores_out][:n_out])


def _bias(bb, attr, mask, dtype, q_len, kv_len, past_k, nonpad):
    """The additive bias ``[.., S, T]`` of the mask, the causal and window limits and the key padding, or None."""
    from tvm import relax

    parts = []
    if mask is not None:
        if str(mask.ty.dtype) == "bool":
            mask = bb.emit(relax.op.where(mask, relax.const(0.0, dtype), relax.const(float("-inf"), dtype)))
        elif str(mask.ty.dtype) != dtype:
            mask = bb.emit(relax.op.astype(mask, dtype))
        m_dims = _dims(mask)
        if not _equal(m_dims[-1], kv_len):
            # the spec pads a short mask with hidden keys; only lengths known here can be padded here
            if not (is_static(m_dims[-1]) and is_static(kv_len) and int(m_dims[-1]) < int(kv_len)):
                raise Unsupported(f"attn_mask's key dim {dim_text(m_dims[-1])} is not the key count {dim_text(kv_len)}")
            widths = [0, 0] * (len(m_dims) - 1) + [0, int(kv_len) - int(m_dims[-1])]
            mask = bb.emit(relax.op.nn.pad(mask, widths, pad_value=float("-inf")))
        parts.append(mask)
    left = int(attr.get("left_window_size", -1))
    right = int(attr.get("right_window_size", -1))
    causal = bool(attr.get("is_causal", 0))
    if causal or left >= 0 or right >= 0:
        # where the query block starts: after the cache, or per batch after the non-padding keys
        if past_k is not None:
            offset = _dims(past_k)[2]
        elif nonpad is not None:
            start = bb.emit(relax.op.subtract(relax.op.astype(nonpad, "int64"), _size_tensor(q_len)))
            offset = bb.emit(relax.op.reshape(start, [-1, 1, 1, 1]))
        else:
            offset = 0
        parts.append(position_bias(bb, q_len, kv_len, offset, causal, left, right, dtype))
    if nonpad is not None:
        keys = relax.op.expand_dims(relax.op.arange(0, kv_len, 1, "int64"), 0)                  # [1, T]
        visible = relax.op.less(keys, relax.op.expand_dims(relax.op.astype(nonpad, "int64"), 1))  # [B, T]
        padding = bb.emit(relax.op.where(visible, relax.const(0.0, dtype), relax.const(float("-inf"), dtype)))
        parts.append(bb.emit(relax.op.reshape(padding, [-1, 1, 1, kv_len])))
    if not parts:
        return None
    bias = parts[0]
    for p in parts[1:]:
        bias = bb.emit(relax.op.add(bias, p))
    return bias


def position_bias(bb, q_len, kv_len, offset, causal, left, right, dtype):
    """0 where key j is visible from query i (j <= i + offset when causal; within the window), -inf elsewhere.

    ``offset`` is a size (static or symbolic) or a per-batch ``[B, 1, 1, 1]`` tensor. Static sizes give a constant,
    which the attention rule recognises as causal when it is the bottom-right one; the rest is computed from
    positions."""
    from tvm import relax

    if not isinstance(offset, relax.Expr) and is_static(q_len) and is_static(kv_len) and is_static(offset):
        i = np.arange(int(q_len))[:, None] + int(offset)
        j = np.arange(int(kv_len))[None, :]
        allowed = np.ones((int(q_len), int(kv_len)), bool)
        if causal:
            allowed &= j <= i
        if left >= 0:
            allowed &= i - j <= left
        if right >= 0:
            allowed &= j - i <= right
        return relax.const(np.where(allowed, 0.0, -np.inf).astype(dtype), dtype)
    rows = relax.op.expand_dims(relax.op.arange(0, q_len, 1, "int64"), 1)  # [S, 1]
    pos = relax.op.add(rows, offset if isinstance(offset, relax.Expr) else _size_tensor(offset))
    keys = relax.op.expand_dims(relax.op.arange(0, kv_len, 1, "int64"), 0)  # [1, T]
    conditions = []
    if causal:
        conditions.append(relax.op.less_equal(keys, pos))
    if left >= 0:
        conditions.append(relax.op.less_equal(relax.op.subtract(pos, keys), relax.const(np.int64(left))))
    if right >= 0:
        conditions.append(relax.op.less_equal(relax.op.subtract(keys, pos), relax.const(np.int64(right))))
    allowed = conditions[0]
    for c in conditions[1:]:
        allowed = relax.op.logical_and(allowed, c)
    return bb.emit(relax.op.where(allowed, relax.const(0.0, dtype), relax.const(float("-inf"), dtype)))


def _split_heads(bb, x, heads: int, name: str):
    """``[B, L, H·D]`` → ``[B, H, L, D]``."""
    from tvm import relax

    b, length, hidden = _dims(x)
    if not is_static(hidden) or heads <= 0 or int(hidden) % heads:
        raise Unsupported(f"{name}'s hidden size {dim_text(hidden)} is not a static multiple of its {heads} heads")
    split = bb.emit(relax.op.reshape(x, [b, length, heads, int(hidden) // heads]))
    return bb.emit(relax.op.permute_dims(split, [0, 2, 1, 3]))


def _repeat_kv(bb, x, q_heads):
    """K/V heads repeated to the query heads, ``repeat_kv``'s order (query head h reads K/V head h // n_rep)."""
    from tvm import relax

    b, kv_heads, length, d = _dims(x)
    if _equal(kv_heads, q_heads):
        return x
    if not (is_static(kv_heads) and is_static(q_heads)) or int(q_heads) % int(kv_heads):
        raise Unsupported(f"{dim_text(q_heads)} query heads cannot share {dim_text(kv_heads)} K/V heads")
    rep = int(q_heads) // int(kv_heads)
    wide = bb.emit(relax.op.broadcast_to(relax.op.expand_dims(x, 2), [b, kv_heads, rep, length, d]))
    return bb.emit(relax.op.reshape(wide, [b, int(q_heads), length, d]))


def _rank(x) -> int:
    return len(x.ty.shape.values) if x.ty.shape is not None else -1


def _dims(x) -> List:
    return list(x.ty.shape.values)


def _equal(a, b) -> bool:
    from tvm import sym

    if is_static(a) and is_static(b):
        return int(a) == int(b)
    return bool(sym.Analyzer().can_prove_equal(a, b))


def _size_tensor(d):
    """A size as an int64 tensor (a scalar constant when static, ``[1]`` from the shape when symbolic)."""
    from tvm import relax

    return relax.const(np.int64(int(d)), "int64") if is_static(d) else relax.op.shape_to_tensor(relax.ShapeExpr([d]))


def _onnx_dtype(code) -> str:
    from onnx import helper

    return str(np.dtype(helper.tensor_dtype_to_np_dtype(int(code))))


__all__ = ["convert_onnx_attention", "dim_text", "is_static"]
