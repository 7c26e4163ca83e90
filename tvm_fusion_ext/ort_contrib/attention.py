"""ONNX Runtime's ``com.microsoft.Attention``, written out as the graph :class:`FuseMultiHeadAttention` reads.

ONNX Runtime's optimizer writes it for BERT-style self-attention: one projection of the hidden states by the merged
Q/K/V weights, then scaled dot-product attention per head. Written out as ONNX Runtime's CPU kernel computes it:

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

Refused with a reason: a ``past`` state or ``past_sequence_length`` (a KV cache), ``past_present_share_buffer``,
``do_rotary``, a 4-D mask and the ``3·B + 2`` packed form (ONNX Runtime's CPU kernel has neither), a mask whose
dims are not the batch and key counts, Q and K of different widths, widths the heads do not divide.
"""

from __future__ import annotations

import math

from ..converters import Unsupported
from ..onnx_attention import _position_bias, dim_text, is_static

_MASK_FILTER = -10000.0  # ONNX Runtime's default mask_filter_value


def convert_attention(bb, inputs, attr, outputs):
    """Relax expression for one ``com.microsoft.Attention`` node (a tuple when ``present`` is requested)."""
    from tvm import relax

    x, weights, bias, mask, past, attention_bias, past_len = (
        bb.normalize(v) if v is not None else None for v in (inputs + [None] * 7)[:7])
    _refuse_cache_and_rotary(attr, past, past_len)
    heads = int(attr["num_heads"])
    b, s, _ = _dims(x)
    dtype = str(x.ty.dtype)
    q_width, k_width, v_width = _widths(attr, weights)
    head, v_head = q_width // heads, v_width // heads

    qkv = relax.op.matmul(x, weights)
    if bias is not None:
        qkv = relax.op.add(qkv, bias)
    qkv = bb.emit(qkv)
    parts = bb.emit(relax.op.split(qkv, [q_width, q_width + k_width], axis=2))
    q, k, v = (_split_heads(bb, bb.emit(relax.TupleGetItem(parts, i)), b, s, heads, width // heads)
               for i, width in enumerate((q_width, k_width, v_width)))

    scale = attr.get("scale")
    scale = float(scale) if scale is not None and float(scale) != 0.0 else 1.0 / math.sqrt(head)
    scores = bb.emit(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2])))
    scores = bb.emit(relax.op.multiply(scores, relax.const(scale, dtype)))
    for term in (_mask_bias(bb, mask, attr, b, s, dtype), attention_bias,
                 _position_bias(bb, s, s, 0, True, -1, -1, dtype) if int(attr.get("unidirectional", 0)) else None):
        if term is not None:
            scores = bb.emit(relax.op.add(scores, term))
    probs = bb.emit(relax.op.nn.softmax(scores, axis=-1))
    y = bb.emit(relax.op.matmul(probs, v))
    y = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(y, [0, 2, 1, 3])), [b, s, heads * v_head]))
    if len(outputs) < 2 or not outputs[1]:
        return y if len(outputs) < 2 else relax.Tuple([y, relax.const(0.0, dtype)])
    if head != v_head:
        raise Unsupported(f"the present output with K heads of {head} and V heads of {v_head} (one tensor holds both)")
    present = relax.op.concat([relax.op.expand_dims(k, 0), relax.op.expand_dims(v, 0)], axis=0)
    return relax.Tuple([y, bb.emit(present)])


def _refuse_cache_and_rotary(attr, past, past_len):
    if past is not None or past_len is not None or int(attr.get("past_present_share_buffer", 0)):
        raise Unsupported("a past state (KV cache: past, past_sequence_length, past_present_share_buffer) is not "
                          "supported; optimize a model exported without past inputs")
    if int(attr.get("do_rotary", 0)):
        raise Unsupported("do_rotary=1 (rotary embeddings inside the attention) is not supported")


def _widths(attr, weights):
    """``(q, k, v)`` projection widths: ``qkv_hidden_sizes``, or the merged weights' width in three."""
    heads = int(attr["num_heads"])
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
    if q % heads or v % heads:
        raise Unsupported(f"the widths {q} (Q, K) and {v} (V) are not multiples of num_heads={heads}")
    return q, k, v


def _split_heads(bb, t, b, s, heads, head):
    """``[B, S, N·h]`` → ``[B, N, S, h]``."""
    from tvm import relax

    return bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(t, [b, s, heads, head])), [0, 2, 1, 3]))


def _mask_bias(bb, mask, attr, b, s, dtype):
    """The additive ``[B, 1, S or 1, T]`` mask of ``mask_index`` (see the module docstring), or None."""
    from tvm import relax

    if mask is None:
        return None
    fill = attr.get("mask_filter_value")
    fill = relax.const(float(fill) if fill is not None else _MASK_FILTER, dtype)
    zero = relax.const(0.0, dtype)
    dims = _dims(mask)
    if len(dims) == 1:
        keys = relax.op.expand_dims(relax.op.arange(0, s, 1, "int32"), 0)  # [1, T]
        if _equal(dims[0], b):
            ends = bb.emit(relax.op.expand_dims(relax.op.astype(mask, "int32"), 1))  # [B, 1]
            seen = relax.op.less(keys, ends)
        elif _equal(dims[0], 2 * b):
            ends_starts = bb.emit(relax.op.reshape(relax.op.astype(mask, "int32"), [2, b, 1]))
            ends = relax.op.squeeze(relax.op.strided_slice(ends_starts, [0], [0], [1]), [0])
            starts = relax.op.squeeze(relax.op.strided_slice(ends_starts, [0], [1], [2]), [0])
            seen = relax.op.logical_and(relax.op.less(keys, ends), relax.op.greater_equal(keys, starts))
        else:
            raise Unsupported(f"a 1-D mask_index of {dim_text(dims[0])} entries for batch {dim_text(b)} (only the "
                              f"[batch] and [2·batch] forms are supported)")
        return bb.emit(relax.op.reshape(relax.op.where(seen, zero, fill), [b, 1, 1, s]))
    if len(dims) == 2:
        want, view = [b, s], [b, 1, 1, s]
    elif len(dims) == 3:
        want, view = [b, s, s], [b, 1, s, s]
    else:
        raise Unsupported(f"a {len(dims)}-D mask_index (ONNX Runtime's CPU kernel reads 1-D, 2-D and 3-D masks)")
    if not all(_equal(d, w) for d, w in zip(dims, want)):
        raise Unsupported(f"mask_index of shape [{', '.join(dim_text(d) for d in dims)}], expected "
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
