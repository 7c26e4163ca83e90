"""ONNX Runtime's ``com.microsoft.Attention`` and ``MultiHeadAttention``, written out as the graph
:class:`FuseMultiHeadAttention` reads.

ONNX Runtime's optimizer writes ``Attention`` for BERT-style self-attention: one projection of the hidden states by
the merged Q/K/V weights, then scaled dot-product attention per head (``MultiHeadAttention``, with
``use_multi_head_attention``, takes the three projections' outputs and their merged bias instead). Written out as
ONNX Runtime's CPU kernel computes it:

    qkv          ``x · W (+ bias)``, split at ``qkv_hidden_sizes`` (default three equal parts), each ``[B, N, S, h]``
    scores       ``q · kᵀ · scale`` (default ``1/√h``) ``+ mask + attention_bias``
    mask         from ``mask_index``, 0 where a key is seen and ``mask_filter_value`` (default -10000) where not:
                 ``[B]`` key counts (keys at or after the count hidden: right padding), ``[2B]`` counts then
                 starts (keys before the start hidden too: left padding), ``[B, T]`` and ``[B, S, T]`` 0/1 masks
                 (hidden where the value is not positive); with ``unidirectional``, keys after the query hidden
    y            ``softmax(scores) · v``, heads merged back to ``[B, S, N·h_v]``; ``present`` is ``[2, B, N, S, h]``

The additive mask stays ``mask_filter_value``, not -inf: a row whose keys are all hidden is then the softmax of its
plain scores, as ONNX Runtime gives it. The causal part is -inf (ONNX Runtime fills it with float's lowest value;
every row sees its own key, so the two give the same probabilities) and is the constant the rule reads as causal.

``MultiHeadAttention``'s ``key_padding_mask`` is read the same way (``[B]``, ``[B, T]``, ``[B, S, T]``; T may
differ from S: cross attention). Refused with a reason: a ``past`` state or ``past_sequence_length`` (a KV cache),
``past_present_share_buffer``, ``do_rotary``, a 4-D mask and the ``3·B + 2`` packed form (ONNX Runtime's CPU
kernel has neither), a mask whose dims are not the batch and key counts, Q and K of different widths, widths the
heads do not divide; for ``MultiHeadAttention`` also packed QKV or KV, 4-D key/value heads, and the
``present_*``/``qk`` outputs.
"""

from __future__ import annotations

import math

from ..errors import Unsupported
from ..converters.attention import position_bias
from ..converters.common import dim_text, is_static

_MASK_FILTER = -10000.0  # ONNX Runtime's default mask_filter_value


def convert_attention(bb, inputs, attr, outputs):
    """Relax expression for one ``com.microsoft.Attention`` node (a tuple when ``present`` is requested)."""
    from tvm import relax

    x, weights, bias, mask, past, attention_bias, past_len = (
        bb.normalize(v) if v is not None else None for v in (inputs + [None] * 7)[:7])
    _refuse_cache_and_rotary(attr, past, past_len)
    b, s, _ = _dims(x)
    q_width, k_width, v_width = _widths(attr, weights)

    qkv = relax.op.matmul(x, weights)
    if bias is not None:
        qkv = relax.op.add(qkv, bias)
    qkv = bb.emit(qkv)
    parts = bb.emit(relax.op.split(qkv, [q_width, q_width + k_width], axis=2))
    q, k, v = (bb.emit(relax.TupleGetItem(parts, i)) for i in range(3))
    y, k, v = _attend(bb, q, k, v, attr, _mask_bias(bb, mask, attr, b, s, s, str(x.ty.dtype), "mask_index", True),
                      attention_bias)
    if len(outputs) < 2 or not outputs[1]:
        return y if len(outputs) < 2 else relax.Tuple([y, relax.const(0.0, str(x.ty.dtype))])
    if q_width != v_width:
        raise Unsupported(f"the present output with K and V of widths {k_width} and {v_width} (one tensor holds both)")
    present = relax.op.concat([relax.op.expand_dims(k, 0), relax.op.expand_dims(v, 0)], axis=0)
    return relax.Tuple([y, bb.emit(present)])


def convert_multi_head_attention(bb, inputs, attr, outputs):
    """Relax expression for one ``com.microsoft.MultiHeadAttention`` node with separate 3-D Q, K and V (the form
    the optimizer writes with ``use_multi_head_attention``: the projections' outputs, their biases merged)."""
    from tvm import relax

    (q, k, v, bias, mask, attention_bias, past_k, past_v, past_len, cache) = (
        bb.normalize(x) if x is not None else None for x in (inputs + [None] * 10)[:10])
    if any(x is not None for x in (past_k, past_v, past_len, cache)):
        raise Unsupported("a past state (KV cache: past_key, past_value, past_sequence_length, cache_indirection) "
                          "is not supported; optimize a model exported without past inputs")
    if k is None or v is None or any(len(_dims(x)) != 3 for x in (q, k, v)):
        raise Unsupported("only separate 3-D query, key and value are supported (not packed QKV/KV or 4-D "
                          "key/value heads)")
    if any(name for name in outputs[1:]):
        raise Unsupported("the present_key/present_value/qk outputs are not supported")
    if bias is not None:
        widths = [_dims(x)[2] for x in (q, k, v)]
        if not all(is_static(w) for w in widths):
            raise Unsupported("a bias over Q/K/V widths that are not static")
        q_w, k_w = int(widths[0]), int(widths[1])
        parts = bb.emit(relax.op.split(bias, [q_w, q_w + k_w], axis=0))
        q, k, v = (bb.emit(relax.op.add(x, relax.TupleGetItem(parts, i))) for i, x in enumerate((q, k, v)))
    b, s, _ = _dims(q)
    t = _dims(k)[1]
    mask_bias = _mask_bias(bb, mask, attr, b, s, t, str(q.ty.dtype), "key_padding_mask", False)
    y, _, _ = _attend(bb, q, k, v, attr, mask_bias, attention_bias)
    return y if len(outputs) < 2 else relax.Tuple([y, *[relax.const(0.0, str(q.ty.dtype))] * (len(outputs) - 1)])


def _attend(bb, q, k, v, attr, mask_bias, attention_bias):
    """``(y, k, v)``: scaled dot-product attention of the 3-D projections ``q [B, S, N·h]``, ``k [B, T, N·h]``,
    ``v [B, T, N·h_v]`` with the additive mask, ``attention_bias`` and (``unidirectional``) the causal limit;
    ``y`` is ``[B, S, N·h_v]``, ``k`` and ``v`` are returned split into heads ``[B, N, T, h]``."""
    from tvm import relax

    heads = int(attr["num_heads"])
    widths = [_dims(x)[2] for x in (q, k, v)]
    if not all(is_static(w) for w in widths) or any(int(w) % heads for w in widths) or widths[0] != widths[1]:
        raise Unsupported(f"Q/K/V widths {', '.join(dim_text(w) for w in widths)} are not equal Q and K widths "
                          f"that num_heads={heads} divides")
    head, v_head = int(widths[0]) // heads, int(widths[2]) // heads
    b, s = _dims(q)[:2]
    t = _dims(k)[1]
    dtype = str(q.ty.dtype)
    q, k, v = (_split_heads(bb, x, b, length, heads, width)
               for x, length, width in ((q, s, head), (k, t, head), (v, t, v_head)))
    scale = attr.get("scale")
    scale = float(scale) if scale is not None and float(scale) != 0.0 else 1.0 / math.sqrt(head)
    scores = bb.emit(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2])))
    scores = bb.emit(relax.op.multiply(scores, relax.const(scale, dtype)))
    causal = position_bias(bb, s, t, 0, True, -1, -1, dtype) if int(attr.get("unidirectional", 0)) else None
    for term in (mask_bias, attention_bias, causal):
        if term is not None:
            scores = bb.emit(relax.op.add(scores, term))
    probs = bb.emit(relax.op.nn.softmax(scores, axis=-1))
    y = bb.emit(relax.op.matmul(probs, v))
    y = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(y, [0, 2, 1, 3])), [b, s, heads * v_head]))
    return y, k, v


def _refuse_cache_and_rotary(attr, past, past_len):
    if past is not None or past_len is not None or int(attr.get("past_present_share_buffer", 0)):
        raise Unsupported("a past state (KV cache: past, past_sequence_length, past_present_share_buffer) is not "
                          "supported; optimize a model exported without past inputs")
    if int(attr.get("do_rotary", 0)):
        raise Unsupported("do_rotary=1 (rotary embeddings inside the attention) is not supported")


def _widths(attr, weights):
    """``(q, k, v)`` projection widths: ``qkv_hidden_sizes``, or the merged weights' width in three."""
    total = _dims(weights)[1]
    if not is_static(total):
        raise Unsupported(f"the merged Q/K/V weights' width {dim_text(total)} is not static")
    sizes = attr.get("qkv_hidden_sizes")
    if sizes is not None:
        q, k, v = (int(w) for w in sizes)
        if q + k + v != int(total):
            raise Unsupported(f"qkv_hidden_sizes {[q, k, v]} do not add up to the weights' width {int(total)}")
    elif int(total) % 3:
        raise Unsupported(f"the weights' width {int(total)} is not three equal Q/K/V parts (no qkv_hidden_sizes)")
    else:
        q = k = v = int(total) // 3
    if q != k:
        raise Unsupported(f"Q and K widths differ ({q} and {k}); ONNX Runtime requires them equal")
    return q, k, v


def _split_heads(bb, t, b, s, heads, head):
    """``[B, S, N·h]`` → ``[B, N, S, h]``."""
    from tvm import relax

    return bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(t, [b, s, heads, head])), [0, 2, 1, 3]))


def _mask_bias(bb, mask, attr, b, s, t, dtype, name, ends_and_starts):
    """The additive ``[B, 1, S or 1, T]`` mask of ``mask`` (see the module docstring), or None. ``ends_and_starts``:
    whether the 1-D ``[2B]`` form (Attention's, not MultiHeadAttention's) is read."""
    from tvm import relax

    if mask is None:
        return None
    fill = attr.get("mask_filter_value")
    fill = relax.const(float(fill) if fill is not None else _MASK_FILTER, dtype)
    zero = relax.const(0.0, dtype)
    dims = _dims(mask)
    if len(dims) == 1:
        keys = relax.op.expand_dims(relax.op.arange(0, t, 1, "int32"), 0)  # [1, T]
        if _equal(dims[0], b):
            ends = bb.emit(relax.op.expand_dims(relax.op.astype(mask, "int32"), 1))  # [B, 1]
            seen = relax.op.less(keys, ends)
        elif ends_and_starts and _equal(dims[0], 2 * b):
            ends_starts = bb.emit(relax.op.reshape(relax.op.astype(mask, "int32"), [2, b, 1]))
            ends = relax.op.squeeze(relax.op.strided_slice(ends_starts, [0], [0], [1]), [0])
            starts = relax.op.squeeze(relax.op.strided_slice(ends_starts, [0], [1], [2]), [0])
            seen = relax.op.logical_and(relax.op.less(keys, ends), relax.op.greater_equal(keys, starts))
        else:
            forms = "[batch] and [2·batch] forms are" if ends_and_starts else "[batch] form is"
            raise Unsupported(f"a 1-D {name} of {dim_text(dims[0])} entries for batch {dim_text(b)} (only the "
                              f"{forms} supported)")
        return bb.emit(relax.op.reshape(relax.op.where(seen, zero, fill), [b, 1, 1, t]))
    if len(dims) == 2:
        want, view = [b, t], [b, 1, 1, t]
    elif len(dims) == 3:
        want, view = [b, s, t], [b, 1, s, t]
    else:
        raise Unsupported(f"a {len(dims)}-D {name} (ONNX Runtime's CPU kernel reads 1-D, 2-D and 3-D masks)")
    if not all(_equal(d, w) for d, w in zip(dims, want)):
        raise Unsupported(f"{name} of shape [{', '.join(dim_text(d) for d in dims)}], expected "
                          f"[{', '.join(dim_text(w) for w in want)}]")
    seen = relax.op.greater(mask, relax.const(0, str(mask.ty.dtype)))
    return bb.emit(relax.op.reshape(relax.op.where(seen, zero, fill), view))


def _dims(x):
    return list(x.ty.shape.values)


def _equal(a, b) -> bool:
    from tvm import sym

    if is_static(a) and is_static(b):
        return int(a) == int(b)
    return bool(sym.Analyzer().can_prove_equal(a, b))
