"""The end-to-end models of the campaign, on both sides: their configurations, their weights made from a seed
(numpy, the same numbers here and there), and their forward pass in plain torch (the GPU machine has torch but
no transformers), written against transformers' parameter names so the build side can load the same weights
into transformers' models to export them.

Run side: numpy and torch only.
"""

from __future__ import annotations

import math
from typing import Dict, List, Tuple

import numpy as np

#: the campaign's models: BERT-base (as transformers' ``BertModel`` without pooler) and a LLaMA-shaped prefill
#: (``LlamaModel``, grouped-query attention; 4 layers and an 8k vocabulary keep the weights made there from a seed
#: to a few seconds); ``*-tiny`` are the CPU rehearsal's
MODELS = {
    "bert-base": dict(family="bert", hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                      intermediate_size=3072, vocab_size=30522, max_position_embeddings=512, type_vocab_size=2,
                      layer_norm_eps=1e-12),
    "llama-2048": dict(family="llama", hidden_size=2048, num_hidden_layers=4, num_attention_heads=16,
                       num_key_value_heads=4, intermediate_size=5632, vocab_size=8192, max_position_embeddings=2048,
                       rms_norm_eps=1e-6, rope_theta=10000.0),
    "bert-tiny": dict(family="bert", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=128, vocab_size=1000, max_position_embeddings=64, type_vocab_size=2,
                      layer_norm_eps=1e-12),
    "llama-tiny": dict(family="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=160, vocab_size=1000, max_position_embeddings=64,
                       rms_norm_eps=1e-6, rope_theta=10000.0),
}
#: the shapes measured: batch × tokens
SHAPES = [(b, s) for b in (1, 8, 32) for s in (128, 512)]
QUICK_SHAPES = [(1, 16), (2, 32)]
WEIGHT_STD = 0.02  # transformers' initializer_range for both families


def parameter_shapes(name: str) -> List[Tuple[str, Tuple[int, ...]]]:
    """``[(transformers parameter name, shape)]`` of the model, in the order its weights are drawn."""
    c = MODELS[name]
    H, I, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    out = []
    if c["family"] == "bert":
        out += [("embeddings.word_embeddings.weight", (c["vocab_size"], H)),
                ("embeddings.position_embeddings.weight", (c["max_position_embeddings"], H)),
                ("embeddings.token_type_embeddings.weight", (c["type_vocab_size"], H)),
                ("embeddings.LayerNorm.weight", (H,)), ("embeddings.LayerNorm.bias", (H,))]
        for i in range(L):
            p = f"encoder.layer.{i}."
            for proj in ("query", "key", "value"):
                out += [(f"{p}attention.self.{proj}.weight", (H, H)), (f"{p}attention.self.{proj}.bias", (H,))]
            out += [(f"{p}attention.output.dense.weight", (H, H)), (f"{p}attention.output.dense.bias", (H,)),
                    (f"{p}attention.output.LayerNorm.weight", (H,)), (f"{p}attention.output.LayerNorm.bias", (H,)),
                    (f"{p}intermediate.dense.weight", (I, H)), (f"{p}intermediate.dense.bias", (I,)),
                    (f"{p}output.dense.weight", (H, I)), (f"{p}output.dense.bias", (H,)),
                    (f"{p}output.LayerNorm.weight", (H,)), (f"{p}output.LayerNorm.bias", (H,))]
        return out
    D = H // c["num_attention_heads"]
    KV = c["num_key_value_heads"] * D
    out.append(("embed_tokens.weight", (c["vocab_size"], H)))
    for i in range(L):
        p = f"layers.{i}."
        out += [(f"{p}self_attn.q_proj.weight", (H, H)), (f"{p}self_attn.k_proj.weight", (KV, H)),
                (f"{p}self_attn.v_proj.weight", (KV, H)), (f"{p}self_attn.o_proj.weight", (H, H)),
                (f"{p}mlp.gate_proj.weight", (I, H)), (f"{p}mlp.up_proj.weight", (I, H)),
                (f"{p}mlp.down_proj.weight", (H, I)),
                (f"{p}input_layernorm.weight", (H,)), (f"{p}post_attention_layernorm.weight", (H,))]
    out.append(("norm.weight", (H,)))
    return out


def make_weights(name: str, seed: int) -> Dict[str, np.ndarray]:
    """The model's parameters in float16 from ``numpy.random.default_rng(seed)``: N(0, 0.02) for matrices, biases
    and embeddings, 1 + N(0, 0.02) for norm scales (so that they are neither all equal nor near zero)."""
    rng = np.random.default_rng(seed)
    out = {}
    for pname, shape in parameter_shapes(name):
        a = rng.standard_normal(shape, dtype=np.float32) * np.float32(WEIGHT_STD)
        if pname.endswith("norm.weight") or pname.endswith("LayerNorm.weight"):
            a += np.float32(1.0)
        out[pname] = a.astype(np.float16)
    return out


def weights_fingerprint(weights: Dict[str, np.ndarray]) -> float:
    """A number both sides compute from the weights: a numpy on the GPU machine whose generator drew other numbers
    would be caught before anything is compared."""
    return float(sum(float(np.asarray(w[:2], np.float64).sum()) for w in weights.values()))


def make_inputs(name: str, batch: int, seq: int, seed: int) -> Dict[str, np.ndarray]:
    """int64 token ids (and, for BERT, zero token types), every token real (an all-ones mask)."""
    c = MODELS[name]
    rng = np.random.default_rng(seed + 1000 * batch + seq)
    ids = rng.integers(0, c["vocab_size"], size=(batch, seq), dtype=np.int64)
    out = {"input_ids": ids, "attention_mask": np.ones((batch, seq), np.int64)}
    if c["family"] == "bert":
        out["token_type_ids"] = np.zeros((batch, seq), np.int64)
    return out


def input_names(name: str) -> Tuple[str, ...]:
    return ("input_ids", "attention_mask", "token_type_ids") if MODELS[name]["family"] == "bert" else \
        ("input_ids", "attention_mask")


# -- torch forward passes (plain torch: what runs on the GPU machine) ---------------------------------------------
def torch_forward(name: str, params: dict, input_ids):
    """``last_hidden_state`` of the model for ``input_ids`` (every token real), with ``params`` (torch tensors by
    transformers name, all of one dtype and device): transformers' eager computation, op for op."""
    c = MODELS[name]
    return (_bert if c["family"] == "bert" else _llama)(c, params, input_ids)


def _bert(c, p, ids):
    import torch
    import torch.nn.functional as F

    B, S = ids.shape
    H, heads, eps = c["hidden_size"], c["num_attention_heads"], c["layer_norm_eps"]
    D = H // heads
    positions = torch.arange(S, device=ids.device)
    x = p["embeddings.word_embeddings.weight"][ids] + p["embeddings.token_type_embeddings.weight"][0] + \
        p["embeddings.position_embeddings.weight"][positions]
    x = F.layer_norm(x, (H,), p["embeddings.LayerNorm.weight"], p["embeddings.LayerNorm.bias"], eps)
    for i in range(c["num_hidden_layers"]):
        pre = f"encoder.layer.{i}."

        def lin(n, t, pre=pre):
            return F.linear(t, p[f"{pre}{n}.weight"], p[f"{pre}{n}.bias"])

        q, k, v = (lin(f"attention.self.{n}", x).view(B, S, heads, D).transpose(1, 2) for n in ("query", "key", "value"))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, S, H)
        x = F.layer_norm(lin("attention.output.dense", a) + x, (H,), p[f"{pre}attention.output.LayerNorm.weight"],
                         p[f"{pre}attention.output.LayerNorm.bias"], eps)
        h = F.gelu(lin("intermediate.dense", x))
        x = F.layer_norm(lin("output.dense", h) + x, (H,), p[f"{pre}output.LayerNorm.weight"],
                         p[f"{pre}output.LayerNorm.bias"], eps)
    return x


def _rms_norm(x, w, eps):
    import torch

    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate_half(x):
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _llama(c, p, ids):
    import torch
    import torch.nn.functional as F

    B, S = ids.shape
    H, heads, kv, eps = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["rms_norm_eps"]
    D = H // heads
    x = p["embed_tokens.weight"][ids]
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.int64, device=ids.device).float() / D))
    freqs = torch.arange(S, device=ids.device).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    for i in range(c["num_hidden_layers"]):
        pre = f"layers.{i}."
        h = _rms_norm(x, p[f"{pre}input_layernorm.weight"], eps)
        q = F.linear(h, p[f"{pre}self_attn.q_proj.weight"]).view(B, S, heads, D).transpose(1, 2)
        k = F.linear(h, p[f"{pre}self_attn.k_proj.weight"]).view(B, S, kv, D).transpose(1, 2)
        v = F.linear(h, p[f"{pre}self_attn.v_proj.weight"]).view(B, S, kv, D).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k, v = (t.repeat_interleave(heads // kv, dim=1) for t in (k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(D))
        x = x + F.linear(a.transpose(1, 2).reshape(B, S, H), p[f"{pre}self_attn.o_proj.weight"])
        h = _rms_norm(x, p[f"{pre}post_attention_layernorm.weight"], eps)
        g = F.silu(F.linear(h, p[f"{pre}mlp.gate_proj.weight"])) * F.linear(h, p[f"{pre}mlp.up_proj.weight"])
        x = x + F.linear(g, p[f"{pre}mlp.down_proj.weight"])
    return _rms_norm(x, p["norm.weight"], eps)
