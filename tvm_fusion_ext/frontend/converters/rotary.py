"""ONNX's ``RotaryEmbedding`` op (opset 23), written out as the graph :class:`FuseRotaryEmbedding` reads.

torch's dynamo exporter emits it at opset 23 for the rotary embeddings of LLaMA-style models exported with
dynamic shapes; TVM 0.27 has no converter for it. As with :mod:`.attention`, the op becomes the unfused form
that is correct on its own, and fusing it stays the rule's decision:

    x_r     the first ``rotary_embedding_dim`` features of each head (all when 0); the rest pass through
    cos/sin the caches, gathered by ``position_ids`` when given (else already per batch and position), widened to
            the rotated width: ``[c, c]`` for halves, ``[c₀, c₀, c₁, c₁, ..]`` when ``interleaved``
    y_r     ``x_r · cos + rot(x_r) · sin`` with ``rot`` rotate-half (``[-x₂, x₁]``) or its interleaved form
            (``(-x₁, x₀)`` per pair): ONNX's ``(cos·x₁ - sin·x₂, sin·x₁ + cos·x₂)``, element for element

4-D input is ``[B, H, S, D]``; 3-D input ``[B, S, H·D]`` is split by ``num_heads`` and merged back. Refused with a
reason: a 3-D input without ``num_heads`` or with a hidden size it does not divide, an odd or too wide rotary
width, caches whose last dim is not half the rotary width.
"""

from __future__ import annotations

import functools

from ..errors import Unsupported
from .common import dim_text as _text
from .common import is_static as _static


def convert_onnx_rotary(bb, inputs, attr):
    """Relax expression for one ONNX ``RotaryEmbedding`` node."""
    from tvm import relax

    inputs = list(inputs) + [None] * (4 - len(inputs))
    x, cos, sin, positions = (bb.normalize(t) if t is not None else None for t in inputs[:4])
    dims = list(x.ty.shape.values)
    if len(dims) == 3:
        heads = int(attr.get("num_heads", 0) or 0)
        if heads <= 0 or not _static(dims[2]) or int(dims[2]) % heads:
            raise Unsupported(f"a 3-D input [B, S, {_text(dims[2])}] needs num_heads dividing its hidden size "
                              f"(num_heads={heads})")
        x4 = bb.emit(relax.op.reshape(x, [dims[0], dims[1], heads, int(dims[2]) // heads]))  # BSHD
        table_axis = 2
    elif len(dims) == 4:
        x4, table_axis = x, 1  # BHSD: the tables broadcast over the heads axis
    else:
        raise Unsupported(f"input of rank {len(dims)}, not 3 or 4")
    head = list(x4.ty.shape.values)[3]
    if not _static(head):
        raise Unsupported(f"head size {_text(head)} is not static")
    head = int(head)
    width = int(attr.get("rotary_embedding_dim", 0) or 0) or head
    if width % 2 or width > head:
        raise Unsupported(f"rotary_embedding_dim {width} is odd or wider than the head size {head}")
    for name, table in (("cos_cache", cos), ("sin_cache", sin)):
        last = list(table.ty.shape.values)[-1]
        if not (_static(last) and int(last) == width // 2):
            raise Unsupported(f"{name}'s last dim {_text(last)} is not half the rotary width {width}")
    interleaved = bool(attr.get("interleaved", 0))

    def table_of(cache):
        t = relax.op.take(cache, positions, axis=0) if positions is not None else cache  # [B, S, W/2]
        t = bb.emit(relax.op.expand_dims(t, table_axis))
        if interleaved:  # each angle for both members of its pair
            pairs = bb.emit(relax.op.concat([relax.op.expand_dims(t, -1)] * 2, axis=-1))
            return bb.emit(relax.op.reshape(pairs, [*list(t.ty.shape.values)[:-1], width]))
        return bb.emit(relax.op.concat([t, t], axis=-1))

    cos_w, sin_w = table_of(cos), table_of(sin)
    x_r = x4 if width == head else bb.emit(_last_axis(x4, 0, width))
    if interleaved:
        even, odd = bb.emit(_last_axis(x_r, 0, width, 2)), bb.emit(_last_axis(x_r, 1, width, 2))
        pairs = bb.emit(relax.op.concat([relax.op.expand_dims(relax.op.negative(odd), -1),
                                         relax.op.expand_dims(even, -1)], axis=-1))
        rotated = bb.emit(relax.op.reshape(pairs, list(x_r.ty.shape.values)))
    else:
        half = width // 2
        rotated = bb.emit(relax.op.concat([relax.op.negative(bb.emit(_last_axis(x_r, half, width))),
                                           bb.emit(_last_axis(x_r, 0, half))], axis=-1))
    y = bb.emit(relax.op.add(bb.emit(relax.op.multiply(x_r, cos_w)), bb.emit(relax.op.multiply(rotated, sin_w))))
    if width != head:
        y = bb.emit(relax.op.concat([y, bb.emit(_last_axis(x4, width, head))], axis=-1))
    if len(dims) == 3:
        y = bb.emit(relax.op.reshape(y, dims))
    return y


def _last_axis(x, begin: int, end: int, step: int = 1):
    from tvm import relax

    return relax.op.strided_slice(x, axes=[-1], begin=[begin], end=[end], strides=[step])


@functools.lru_cache(maxsize=None)
def converters():
    """``{"RotaryEmbedding": converter}`` for the importer's map (TVM 0.27 has none for this op)."""
    from tvm.relax.frontend.onnx import onnx_frontend as of

    class RotaryEmbedding(of.OnnxOpConverter):
        @classmethod
        def _impl_v23(cls, bb, inputs, attr, params):
            return convert_onnx_rotary(bb, inputs, attr)

    return {"RotaryEmbedding": RotaryEmbedding}


__all__ = ["convert_onnx_rotary", "converters"]
