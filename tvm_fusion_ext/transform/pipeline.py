"""SemanticFusion: the ordered pipeline of every pass in this package."""

from __future__ import annotations

import tvm
from tvm import relax

from .attention import FuseMultiHeadAttention
from .attention_qkv_heads import ReadAttentionHeadsInPlace
from .canonicalize import Canonicalize
from .dense import FuseMatmulBiasActivation
from .gated_mlp import FuseGatedMLP
from .layernorm import FuseBiasResidualLayerNorm
from .padding import RemovePadding
from .qkv import FuseQKVProjection
from .rmsnorm import FuseRMSNorm
from .rope import FuseRotaryEmbedding
from .shape_computations import ResolveShapeComputations


def SemanticFusion(remove_padding: bool = False) -> tvm.transform.Pass:  # noqa: N802
    """Resolve size computations to the input dims they equal (dynamic-axis exports), canonicalise, then fuse:
    gated MLPs first (QKV would otherwise merge their gate and up projections into a matmul + split), QKV next
    (it needs the three separate projections), attention next (it
    absorbs head split/merge reshapes that dense fusion would otherwise leave stranded), then dense epilogues,
    then residual LayerNorms (which see the dense outputs as their inputs). Last, ``remove_padding``: the
    token-wise part of an encoder runs on the valid tokens of its ``attention_mask`` only (it reads the fused
    graph: :mod:`.padding`). Very last, attentions fed by split pieces of one tensor read their heads from it in
    place (:mod:`.attention_qkv_heads`), on the padded or the packed graph alike."""
    passes = [
        ResolveShapeComputations(),
        relax.transform.CanonicalizeBindings(),
        Canonicalize(),
        FuseGatedMLP(),
        FuseQKVProjection(),
        FuseRotaryEmbedding(),
        FuseMultiHeadAttention(),
        FuseMatmulBiasActivation(),
        FuseBiasResidualLayerNorm(),
        FuseRMSNorm(),
    ]
    if remove_padding:
        passes.append(RemovePadding())
    passes.append(ReadAttentionHeadsInPlace())
    return tvm.transform.Sequential(passes, name="tfx.SemanticFusion")
