"""Current families beyond test_decoder_families.py, each with its own twist (see ``models.hf.OTHER_FAMILIES``):
tiny random-weight exports (torch's dynamo exporter, batch 2, rows of different valid lengths through the mask)
must fuse what their meaning allows, build, and match torch within 1e-4 at the valid positions.

Gemma2's soft-capped logits (``cap · tanh(s / cap)`` before the softmax) fuse with the operator's ``softcap``.
DeBERTa-v3's disentangled terms (q against relative-position keys, relative-position queries
against k, each gathered by relative distance) are tensors added to the scaled q·kᵀ: they reach the operator as
additive masks (correct; the S×T terms exist either way). BLOOM's ALiBi bias is added to
``[B·H, S, T]`` scores (one ``baddbmm``) before they are viewed as ``[B, H, S, T]``: it reaches the operator as a
``[B, H, 1, T]`` mask. Falcon's multi-query attention (one K/V head broadcast by the matmul) fuses. The legacy LLaMA export's identity
fp32 casts (the residual reads the cast) are looked through: all five RMSNorms fuse. Legacy exports of
Phi-3 and GPT-NeoX compute their chunk bounds from sizes: they import (the bounds fold) and fuse. XGLM clamps its
masked scores at float's lowest value, the identity on finite scores: the clamp goes and the attention fuses.
DeepSeek-V3's latent attention has V heads narrower than Q/K's: the operator takes V's head dim. SqueezeBERT
multiplies channel-first K as ``[B, H, D, T]``: read through a transposed copy."""

import numpy as np
import pytest

from tvm_fusion_ext.compile import fuse
from tvm_fusion_ext.frontend import load_onnx

pytest.importorskip("torch")
pytest.importorskip("transformers")

SEQ = 20
BATCH = 2

_DECODER = dict(attention=2, rope=4, gated_mlp=2, dense=6)
# (kind, exporter, attention implementation, fusion counts that must hold). Each case takes 10-30 s on the shared
# 2-core box (export, fuse, one build): slow.
CASES = [
    ("llama", "legacy", "sdpa", dict(_DECODER, rmsnorm=5, qkv=2)),
    ("mistral", "dynamo", "sdpa", dict(_DECODER, rmsnorm=5, qkv=2)),  # sliding window 8 < SEQ: in the mask
    ("phi3", "dynamo", "sdpa", dict(_DECODER, rmsnorm=5, qkv=0)),  # qkv_proj is one projection already
    # torch.chunk's slice bounds computed from sizes (folded at import), gate_up_proj halved by two slices
    ("phi3", "legacy", "sdpa", dict(_DECODER, rmsnorm=5, qkv=0)),
    ("gemma", "dynamo", "sdpa", dict(_DECODER, rmsnorm=5, qkv=2)),
    ("qwen3", "dynamo", "sdpa", dict(_DECODER, rmsnorm=9, qkv=2)),  # + q_norm and k_norm per layer
    ("olmo2", "dynamo", "sdpa", dict(_DECODER, rmsnorm=9, qkv=2)),
    # soft-capped logits (cap · tanh(s / cap), here with a cap of 1 so that it bends): the operator's softcap
    ("gemma2", "dynamo", "eager", dict(attention=2, rope=4, gated_mlp=2, rmsnorm=9, qkv=2, dense=6)),
    ("gemma2", "legacy", "eager", dict(attention=2, rope=4, gated_mlp=2, rmsnorm=9, qkv=2, dense=6)),
    ("gpt2", "dynamo", "sdpa", dict(attention=2, layernorm=5, dense=8)),
    # GPT-NeoX's two norms of one residual are identical in a random init: the exporter keeps one
    ("gpt_neox", "dynamo", "sdpa", dict(attention=2, rope=4, layernorm=3, qkv=2, dense=6)),  # partial rotary
    ("gpt_neox", "legacy", "sdpa", dict(attention=2, rope=4, layernorm=5, dense=8)),
    ("phi", "dynamo", "sdpa", dict(attention=2, rope=4, layernorm=3, qkv=2, dense=6)),  # partial rotary
    # multi-query: K and V picked by gather_nd (canonicalised to slices), one K/V head broadcast by the matmul
    ("falcon", "dynamo", "sdpa", dict(attention=2, rope=4, layernorm=3, qkv=2, dense=6)),
    ("bloom", "dynamo", "eager", dict(attention=2, layernorm=6, dense=8)),  # ALiBi on [B·H, S, T] scores
    ("bloom", "legacy", "eager", dict(attention=2, layernorm=6, dense=8)),  # + one-input K/V concats
    ("t5-encoder", "dynamo", "sdpa", dict(attention=2, rmsnorm=5, qkv=2, dense=8)),  # relative bias as the mask
    # disentangled scores (c2p and p2c terms, gathered by relative position) are added to q·kᵀ: additive masks
    ("deberta-v2", "dynamo", "eager", dict(attention=2, layernorm=6, qkv=3, dense=9)),
    ("deberta-v2", "legacy", "eager", dict(attention=2, layernorm=6, qkv=4, dense=10)),
    ("gptj", "dynamo", "eager", dict(attention=2, rope=4, layernorm=3, qkv=2, dense=6)),  # interleaved rotary
    # scores clamped at float's lowest value (dropped: the identity on finite scores), 3-D [B·H, S, D] matmuls
    ("xglm", "dynamo", "eager", dict(attention=2, layernorm=5, qkv=2, dense=8)),
    ("helium", "dynamo", "sdpa", dict(_DECODER, rmsnorm=5, qkv=2)),  # RMSNorm without eps
    # bias-free LayerNorm = RMSNorm of x - mean(x); parallel attention and MLP share one norm per layer
    ("cohere", "dynamo", "sdpa", dict(_DECODER, rmsnorm=3, qkv=2)),
    ("opt", "dynamo", "sdpa", dict(attention=2, layernorm=5, qkv=2, dense=8)),
    # multi-head latent attention: v's head dim (16) is not q/k's (24 = 16 + 8 rotary); the operator takes both
    ("deepseek-v3", "dynamo", "sdpa", dict(attention=2, rmsnorm=9, gated_mlp=2)),
    ("deepseek-v3", "legacy", "sdpa", dict(attention=2, rmsnorm=9, gated_mlp=2)),
    # channel-first heads (1×1 convolutions): K read through a transposed copy; the two ungrouped convolutions become
    # fused dense (ConvAsMatmul), the grouped Q/K/V and FFN ones batched matmuls per group
    ("squeezebert", "dynamo", "eager", dict(attention=2, layernorm=5, dense=2)),  # its ungrouped 1-wide convs
    ("squeezebert", "legacy", "eager", dict(attention=2, layernorm=5, dense=2)),
]


def _mixed_lengths_mask():
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[0, SEQ - 2:] = 0
    mask[1, SEQ - 6:] = 0
    return mask


@pytest.mark.slow
@pytest.mark.parametrize("kind,exporter,attn,counts", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_family_fuses_builds_and_matches_torch(export_dir, kind, exporter, attn, counts):
    import torch

    from tvm_fusion_ext.models import export_hf_model, hf_example_inputs, hf_input_names, hf_model
    from tvm_fusion_ext.runtime import CompiledModel

    path = export_hf_model(kind, export_dir / f"{kind}_{exporter}_b{BATCH}.onnx", exporter=exporter, attn=attn,
                           seq=SEQ, batch=BATCH)
    mod = load_onnx(path)
    _, report = fuse(mod)
    assert {k: report.fused[k] for k in counts} == counts, report.summary()

    module, config = hf_model(kind, attn=attn)
    names = hf_input_names(kind)
    feeds = {k: v for k, v in hf_example_inputs(config, seq=SEQ, batch=BATCH, seed=1).items() if k in names}
    feeds["attention_mask"] = _mixed_lengths_mask()
    got = CompiledModel.from_module(mod).run(feeds)["last_hidden_state"]
    with torch.no_grad():
        ref = module(*(torch.from_numpy(feeds[k]) for k in names)).numpy()
    valid = feeds["attention_mask"].astype(bool)
    np.testing.assert_allclose(got[valid], ref[valid], rtol=1e-4, atol=1e-4)


# Dynamic batch and sequence: exports whose size arithmetic once broke the build (GPT-2's flattened rows,
# BLOOM's batch·heads scalar and its division back, DeBERTa's Tile by the batch, Phi-3's empty rotary slice).
DYNAMIC_CASES = [("gpt2", "dynamo", "sdpa"), ("bloom", "dynamo", "eager"), ("bloom", "legacy", "eager"),
                 ("deberta-v2", "dynamo", "eager"), ("phi3", "legacy", "sdpa"),
                 # GPT-J's Expand of [batch, seq, 1] positions to a constant shape; XGLM's clamp and 3-D matmuls
                 ("gptj", "dynamo", "eager"), ("xglm", "dynamo", "eager")]


@pytest.mark.slow
@pytest.mark.parametrize("kind,exporter,attn", DYNAMIC_CASES, ids=[f"{c[0]}-{c[1]}" for c in DYNAMIC_CASES])
def test_dynamic_export_builds_once_and_matches_torch(export_dir, kind, exporter, attn):
    import torch

    from tvm_fusion_ext.models import export_hf_model, hf_example_inputs, hf_input_names, hf_model
    from tvm_fusion_ext.runtime import CompiledModel

    path = export_hf_model(kind, export_dir / f"{kind}_{exporter}_dynamic.onnx", exporter=exporter, attn=attn,
                           seq=SEQ, batch=BATCH, dynamic=True, max_seq=64)
    model = CompiledModel.from_module(load_onnx(path))
    assert model.report.fused["attention"] == 2, model.report.summary()
    module, config = hf_model(kind, attn=attn)
    names = hf_input_names(kind)
    for batch, seq in ((1, 7), (3, 33)):
        feeds = {k: v for k, v in hf_example_inputs(config, seq=seq, batch=batch, seed=2).items() if k in names}
        mask = np.ones((batch, seq), np.int64)
        mask[batch - 1, seq // 2:] = 0  # one row padded
        feeds["attention_mask"] = mask
        got = model.run(feeds)["last_hidden_state"]
        with torch.no_grad():
            ref = module(*(torch.from_numpy(feeds[k]) for k in names)).numpy()
        valid = mask.astype(bool)
        np.testing.assert_allclose(got[valid], ref[valid], rtol=1e-4, atol=1e-4)
