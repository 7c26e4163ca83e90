"""Decoder attention in the spellings current exporters produce: rotary Q/K, K/V with fewer heads repeated for
the query heads, a constant causal mask; with an independent numpy reference.

Sizes all differ (B=2, S=6, H=4 query heads, D=8) so that a wrong axis shows up as a shape error or a wrong
number. Head split as in HF: ``x·W → reshape [B, S, heads, D] → transpose [0, 2, 1, 3]``.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax

B, S, H, D = 2, 6, 4, 8


def rotate(x, style):
    if style == "half":
        h = x.shape[-1] // 2
        return np.concatenate([-x[..., h:], x[..., :h]], -1)
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = -x[..., 1::2], x[..., 0::2]
    return out


def tables(seq=S, dim=D, batch=1, seed=3):
    """cos/sin of random angles, [batch, seq, dim] (any values: the operator reads whatever the model gives)."""
    ang = np.random.default_rng(seed).standard_normal((batch, seq, dim)).astype("float32")
    return np.cos(ang), np.sin(ang)


def _c(v):
    return relax.const(np.asarray(v, "float32"))


def _rot_graph(bb, x, style, neg="negative", split=None):
    """rot(x) as exporters write it; ``split`` overrides the rotate-half cut (a near miss)."""
    d = x.ty.shape[-1]
    d = int(d)
    negate = (lambda t: relax.op.negative(t)) if neg == "negative" else (lambda t: relax.op.multiply(t, _c(-1.0)))
    if style == "half":
        cut = split if split is not None else d // 2
        hi = bb.emit(negate(bb.emit(relax.op.strided_slice(x, [3], [cut], [2 ** 63 - 1]))))
        lo = bb.emit(relax.op.strided_slice(x, [3], [0], [cut]))
        return bb.emit(relax.op.concat([hi, lo], axis=-1))
    odd = bb.emit(negate(bb.emit(relax.op.strided_slice(x, [3], [1], [2 ** 63 - 1], [2]))))
    even = bb.emit(relax.op.strided_slice(x, [3], [0], [2 ** 63 - 1], [2]))
    pair = bb.emit(relax.op.concat([bb.emit(relax.op.expand_dims(odd, [4])), bb.emit(relax.op.expand_dims(even, [4]))],
                                   axis=-1))
    return bb.emit(relax.op.reshape(pair, x.ty.shape))


def decoder_attention(kv_heads=2, rope="half", repeat="expand", causal=True, cos_shape="11SD", neg="negative",
                      split=None, cos_heads=False, seed=0, mlp=False):
    """``main(x [B,S,H·D]) -> [B,S,H·D]``: projections by constant weights, rope, K/V repeated, causal softmax.

    mlp: complete a LLaMA decoder layer: ``h = x + attention``, then ``h + down(silu(n·Wg) ⊙ (n·Wu))`` with
    ``n = RMSNorm(h)`` spelt as HF writes it (``h · rsqrt(mean(h²) + eps) · γ``, SiLU as ``x · sigmoid(x)``).

    repeat: "expand" (expand_dims → broadcast_to → reshape: HF repeat_kv), "repeat" (relax repeat along heads:
    repeat_interleave), "tile" (relax tile: query head i reads K/V head i mod Hkv), "none" (kv_heads == H).
    cos_shape: "11SD" ([1,1,S,D] constants), "SD" ([S,D]), "B1SD" ([B,1,S,D]).
    """
    rng = np.random.default_rng(seed)
    mlp_weights = _mlp_weights(np.random.default_rng(seed + 100)) if mlp else None
    wq = rng.standard_normal((H * D, H * D)).astype("float32") / math.sqrt(H * D)
    wk = rng.standard_normal((H * D, kv_heads * D)).astype("float32") / math.sqrt(H * D)
    wv = rng.standard_normal((H * D, kv_heads * D)).astype("float32") / math.sqrt(H * D)
    cos, sin = tables(batch=B if cos_shape == "B1SD" else 1)
    if cos_heads:  # a table that differs per head: not a rotary embedding
        cos = np.concatenate([cos[:, None]] * H, axis=1) * np.arange(1, H + 1, dtype="float32")[None, :, None, None]
        sin = np.concatenate([sin[:, None]] * H, axis=1)
    elif cos_shape == "SD":
        cos, sin = cos[0], sin[0]
    else:
        cos, sin = cos[:, None], sin[:, None]
    x = relax.Var("x", relax.TensorType((B, S, H * D), "float32"))
    bb = relax.BlockBuilder()

    def heads(t, n):
        return bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(t, (B, S, n, D))), [0, 2, 1, 3]))

    def rotary(t):
        if rope is None:
            return t
        a = bb.emit(relax.op.multiply(t, _c(cos)))
        b = bb.emit(relax.op.multiply(_rot_graph(bb, t, rope, neg, split), _c(sin)))
        return bb.emit(relax.op.add(a, b))

    def repeated(t):
        n = H // kv_heads
        if repeat == "expand":
            e = bb.emit(relax.op.expand_dims(t, [2]))
            e = bb.emit(relax.op.broadcast_to(e, (B, kv_heads, n, S, D)))
            return bb.emit(relax.op.reshape(e, (B, H, S, D)))
        if repeat == "repeat":
            return bb.emit(relax.op.repeat(t, n, axis=1))
        if repeat == "tile":
            return bb.emit(relax.op.tile(t, [1, n, 1, 1]))
        return t

    with bb.function("main", [x]):
        with bb.dataflow():
            q = rotary(heads(bb.emit(relax.op.matmul(x, _c(wq))), H))
            k = repeated(rotary(heads(bb.emit(relax.op.matmul(x, _c(wk))), kv_heads)))
            v = repeated(heads(bb.emit(relax.op.matmul(x, _c(wv))), kv_heads))
            sc = bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))))
            sc = bb.emit(relax.op.multiply(sc, _c(1 / math.sqrt(D))))
            if causal:
                tri = np.where(np.arange(S)[None, :] > np.arange(S)[:, None], np.float32(-np.inf), np.float32(0))
                sc = bb.emit(relax.op.add(sc, _c(tri[None, None])))
            p = bb.emit(relax.op.nn.softmax(sc, axis=-1))
            o = bb.emit(relax.op.matmul(p, v))
            o = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(o, [0, 2, 1, 3])), (B, S, H * D)))
            if mlp:
                o = _mlp_half(bb, x, o, mlp_weights)
            out = bb.emit_output(o)
        bb.emit_func_output(out)
    weights = {"wq": wq, "wk": wk, "wv": wv, "cos": cos, "sin": sin, **(mlp_weights if mlp else {})}
    return bb.get(), weights


#: the MLP's intermediate width (differs from H·D so that a wrong axis shows)
FFN = 40


def _mlp_weights(rng):
    hd = H * D
    return {"gamma": (1 + 0.1 * rng.standard_normal(hd)).astype("float32"),
            "wg": (rng.standard_normal((hd, FFN)) / math.sqrt(hd)).astype("float32"),
            "wu": (rng.standard_normal((hd, FFN)) / math.sqrt(hd)).astype("float32"),
            "wd": (rng.standard_normal((FFN, hd)) / math.sqrt(FFN)).astype("float32")}


def _mlp_half(bb, x, attn, w):
    h = bb.emit(relax.op.add(x, attn))
    ms = bb.emit(relax.op.mean(bb.emit(relax.op.power(h, _c(2.0))), axis=[-1], keepdims=True))
    n = bb.emit(relax.op.multiply(h, bb.emit(relax.op.rsqrt(bb.emit(relax.op.add(ms, _c(1e-6)))))))
    n = bb.emit(relax.op.multiply(_c(w["gamma"]), n))
    g = bb.emit(relax.op.matmul(n, _c(w["wg"])))
    gate = bb.emit(relax.op.multiply(g, bb.emit(relax.op.sigmoid(g))))
    up = bb.emit(relax.op.matmul(n, _c(w["wu"])))
    down = bb.emit(relax.op.matmul(bb.emit(relax.op.multiply(gate, up)), _c(w["wd"])))
    return bb.emit(relax.op.add(h, down))


def numpy_mlp_half(x, attn, weights):
    """The MLP half of the layer in float64 numpy."""
    h = x.astype("float64") + attn
    n = h / np.sqrt((h ** 2).mean(-1, keepdims=True) + 1e-6) * weights["gamma"]
    g, u = n @ weights["wg"], n @ weights["wu"]
    return h + (g / (1 + np.exp(-g)) * u) @ weights["wd"]


def numpy_decoder_attention(x, weights, kv_heads=2, rope="half", repeat="expand", causal=True):
    """The same computation in float64 numpy, written from its definition."""
    x = x.astype("float64")

    def heads(t, n):
        return t.reshape(B, S, n, D).transpose(0, 2, 1, 3)

    cos, sin = weights["cos"].astype("float64"), weights["sin"].astype("float64")
    if cos.ndim == 2:
        cos, sin = cos[None, None], sin[None, None]

    def rotary(t):
        return t if rope is None else t * cos + rotate(t, rope) * sin

    q = rotary(heads(x @ weights["wq"], H))
    k = rotary(heads(x @ weights["wk"], kv_heads))
    v = heads(x @ weights["wv"], kv_heads)
    n = H // kv_heads
    if repeat == "tile":
        k, v = np.tile(k, (1, n, 1, 1)), np.tile(v, (1, n, 1, 1))
    else:
        k, v = np.repeat(k, n, axis=1), np.repeat(v, n, axis=1)
    sc = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D)
    if causal:
        sc = np.where(np.arange(S)[None, :] > np.arange(S)[:, None], -np.inf, sc)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(B, S, H * D)
