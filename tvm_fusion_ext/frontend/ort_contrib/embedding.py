"""ONNX Runtime's ``EmbedLayerNormalization``: BERT's embeddings and their LayerNorm, written as gathers, a sum and
Relax's ``layer_norm`` (the embeddings' LayerNorm the rules count).

    s           word[input_ids] + position[position_ids] (+ segment[segment_ids])
                position_ids: the input (``[B, S]`` or ``[1, S]``), else ``0 .. S-1``
    output      LayerNorm(s)·γ + β over the hidden axis (``epsilon`` default 1e-12)
    mask_index  per batch row, the number of ``mask`` entries equal to 1 (int32 ``[B]``; zeros without a mask):
                what ONNX Runtime's CPU kernel counts, and the key count ``Attention`` reads
    embedding_sum  ``s``

Token, segment and position ids that do not fit their tables are refused at run time by the gather checks
(``compile/checks/gather_indices.py``), as ONNX Runtime refuses them. TVM's converter read every dim as a number (it
failed on a dynamic batch or sequence) and summed the mask instead of counting its ones.
"""

from __future__ import annotations


def convert_embed_layer_norm(bb, inputs, attr, outputs):
    from tvm import relax

    ids, segment_ids, word, position, segment, gamma, beta, mask, position_ids = (
        bb.normalize(v) if v is not None else None for v in (inputs + [None] * 9)[:9])
    b, s = list(ids.ty.shape.values)
    if position_ids is None:
        position_ids = relax.op.expand_dims(relax.op.arange(0, s, 1, "int64"), 0)  # [1, S]
    total = relax.op.add(relax.op.take(word, ids, axis=0), relax.op.take(position, position_ids, axis=0))
    if segment_ids is not None and segment is not None:
        total = relax.op.add(total, relax.op.take(segment, segment_ids, axis=0))
    total = bb.normalize(total)
    y = relax.op.nn.layer_norm(total, gamma, beta, axes=[-1], epsilon=float(attr.get("epsilon", 1e-12)))
    if len(outputs) < 2:
        return y
    if mask is not None:
        ones = relax.op.astype(relax.op.equal(mask, relax.const(1, str(mask.ty.dtype))), "int32")
        mask_index = relax.op.sum(ones, axis=[1])
    else:
        mask_index = relax.op.zeros(relax.ShapeExpr([b]), "int32")
    return relax.Tuple([y, bb.emit(mask_index), total][: len(outputs)])
