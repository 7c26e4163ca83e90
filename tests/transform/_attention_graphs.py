"""Small attention graphs in the spellings exporters produce, for the attention fusion tests.

Sizes are all different (B=2, H=3, S=5, T=7, D=4) so that a wrong axis shows up as a shape error or a wrong
number, never as a coincidence.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax

B, H, S, T, D = 2, 3, 5, 7, 4
NEG_INF = float("-inf")
F32_MIN = float(np.finfo(np.float32).min)


def _c(v, dtype="float32"):
    return relax.const(v, dtype)


def attention_module(form="bshd", scale="div", mask=None, guard=False, softmax_axis=-1, k_split="0231",
                     probs_used=False, scale_var=False, s=S, t=T, mask_value=NEG_INF, head_merge=True,
                     layers=1, softcap=None):
    """``softmax(scale · q kᵀ + mask) v`` in one of these spellings.

    form: "bshd" (inputs [B,S,H·D], Reshape + Transpose head split, merged output), "bhsd" (4-D inputs, no split),
          "3d" ([B·H, S, D] inputs).
    scale: "div" (scores / √D), "mul" (scores · 1/√D), "q" (q · 1/√D before the matmul), "split" (q and kᵀ each
           · D^-¼), "none".
    softcap: Gemma2's logit soft-capping ``cap · tanh(s / cap)`` of the scaled scores, before the mask.
    mask: None | "causal_add" (constant additive) | "causal_where" (where(tril, s, -inf)) | "causal_mul" (OpenAI
          GPT's s · tril + NEG · (1 - tril), the second term one constant as exporters fold it) | "bool" (bool
          input, where(mask, s, NEG)) | "bool_add" (scores + where(mask, 0, NEG)) | a shape tuple (float input
          added).
    """
    params = []

    def param(name, shape, dtype="float32"):
        v = relax.Var(name, relax.TensorType(shape, dtype))
        params.append(v)
        return v

    if form == "bshd":
        xq, xk, xv = param("xq", (B, s, H * D)), param("xk", (B, t, H * D)), param("xv", (B, t, H * D))
    elif form == "bhsd":
        xq, xk, xv = param("q", (B, H, s, D)), param("k", (B, H, t, D)), param("v", (B, H, t, D))
    else:
        xq, xk, xv = param("q", (B * H, s, D)), param("k", (B * H, t, D)), param("v", (B * H, t, D))
    m = None
    if isinstance(mask, tuple):
        m = param("mask", mask)
    elif mask in ("bool", "bool_add"):
        m = param("mask", (B, 1, 1, t), "bool")
    c = param("c", (), "float32") if scale_var else None

    def layer(bb, xq, xk, xv):
        if form == "bshd":
            q = bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(xq, (B, s, H, D))), [0, 2, 1, 3]))
            k4 = bb.emit(relax.op.reshape(xk, (B, t, H, D)))
            if k_split == "0231":
                kt = bb.emit(relax.op.permute_dims(k4, [0, 2, 3, 1]))
            else:  # [0,2,1,3] then a transpose of the last two axes
                kt = bb.emit(relax.op.permute_dims(bb.emit(relax.op.permute_dims(k4, [0, 2, 1, 3])), [0, 1, 3, 2]))
            v = bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(xv, (B, t, H, D))), [0, 2, 1, 3]))
        else:
            rank = 4 if form == "bhsd" else 3
            q, v = xq, xv
            kt = bb.emit(relax.op.permute_dims(xk, list(range(rank - 2)) + [rank - 1, rank - 2]))
        inv = 1.0 / math.sqrt(D)
        if scale == "q":
            q = bb.emit(relax.op.multiply(q, _c(inv)))
        if scale == "split":
            q = bb.emit(relax.op.multiply(q, _c(D ** -0.25)))
            kt = bb.emit(relax.op.multiply(kt, _c(D ** -0.25)))
        sc = bb.emit(relax.op.matmul(q, kt))
        if scale_var:
            sc = bb.emit(relax.op.divide(sc, c))
        elif scale == "div":
            sc = bb.emit(relax.op.divide(sc, _c(math.sqrt(D))))
        elif scale == "mul":
            sc = bb.emit(relax.op.multiply(sc, _c(inv)))
        if softcap is not None:
            sc = bb.emit(relax.op.multiply(bb.emit(relax.op.tanh(bb.emit(relax.op.divide(sc, _c(softcap))))),
                                           _c(softcap)))
        if isinstance(mask, tuple):
            sc = bb.emit(relax.op.add(sc, m))
        elif mask == "causal_add":
            tri = np.where(np.arange(t)[None, :] > np.arange(s)[:, None] + (t - s), mask_value, 0.0)
            sc = bb.emit(relax.op.add(sc, relax.const(tri.astype("float32"))))
        elif mask == "causal_where":
            tril = relax.const(np.tril(np.ones((s, t), bool), t - s))
            sc = bb.emit(relax.op.where(tril, sc, _c(mask_value)))
        elif mask == "causal_mul":
            tril = np.tril(np.ones((1, 1, s, t), "float32"), t - s)
            sc = bb.emit(relax.op.multiply(sc, relax.const(tril)))
            sc = bb.emit(relax.op.add(sc, relax.const((mask_value * (1 - tril)).astype("float32"))))
        elif mask == "bool":
            sc = bb.emit(relax.op.where(m, sc, _c(mask_value)))
        elif mask == "bool_add":  # the exports' own form: an additive mask built from a boolean one
            sc = bb.emit(relax.op.add(sc, bb.emit(relax.op.where(m, _c(0.0), _c(mask_value)))))
        p = bb.emit(relax.op.nn.softmax(sc, axis=softmax_axis))
        probs = p
        if guard:
            p = bb.emit(relax.op.where(bb.emit(relax.op.isnan(p)), _c(0.0), p))
        o = bb.emit(relax.op.matmul(p, v))
        if form == "bshd" and head_merge:
            o = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(o, [0, 2, 1, 3])), (B, s, H * D)))
        return o, probs

    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            o = xq
            for _ in range(layers):  # a stack: each layer's output is the next one's query input
                o, probs = layer(bb, o, xk, xv)
            o = bb.emit_output(relax.Tuple([o, probs]) if probs_used else o)
        bb.emit_func_output(o)
    return bb.get()


def numpy_attention(inputs, form="bshd", mask=None, s=S, t=T, mask_value=NEG_INF, guard=False):
    """Independent reference: the same attention written directly in numpy (float64)."""
    xq, xk, xv = (a.astype("float64") for a in inputs[:3])
    if form == "bshd":
        q = xq.reshape(B, s, H, D).transpose(0, 2, 1, 3)
        k = xk.reshape(B, t, H, D).transpose(0, 2, 1, 3)
        v = xv.reshape(B, t, H, D).transpose(0, 2, 1, 3)
    else:
        q, k, v = xq, xk, xv
    sc = q @ np.swapaxes(k, -1, -2) / math.sqrt(D)
    if isinstance(mask, tuple):
        sc = sc + inputs[3]
    elif mask in ("causal_add", "causal_where", "causal_mul"):
        hidden = np.arange(t)[None, :] > np.arange(s)[:, None] + (t - s)
        sc = np.where(hidden, mask_value, sc)
    elif mask == "bool":
        sc = np.where(inputs[3], sc, mask_value)
    elif mask == "bool_add":
        sc = sc + np.where(inputs[3], 0.0, mask_value)
    with np.errstate(invalid="ignore"):
        e = np.exp(sc - sc.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
    if guard:
        p = np.where(np.isnan(p), 0.0, p)
    o = p @ v
    if form == "bshd":
        o = o.transpose(0, 2, 1, 3).reshape(B, s, H * D)
    return o
