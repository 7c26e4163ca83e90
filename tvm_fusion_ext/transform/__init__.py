"""Semantic-aware Relax passes. Every pass is a ``tvm.transform.Pass`` usable alone in any Relax pipeline.

Names resolve lazily so that importing one pass (or the rule engine) does not import every rule.
"""

import importlib

_EXPORTS = {
    "Canonicalize": ".canonicalize",
    "FuseBiasResidualLayerNorm": ".layernorm",
    "FuseGatedMLP": ".gated_mlp",
    "FuseMatmulBiasActivation": ".dense",
    "FuseMultiHeadAttention": ".attention",
    "FuseQKVProjection": ".qkv",
    "FuseRMSNorm": ".rmsnorm",
    "FuseRotaryEmbedding": ".rope",
    "ReadAttentionHeadsInPlace": ".attention_qkv_heads",
    "ResolveShapeComputations": ".shape_computations",
    "SemanticFusion": ".pipeline",
    "FusionReport": ".report",
    "Found": ".rule",
    "FunctionGraph": ".graph",
    "FusionRule": ".rule",
    "Match": ".rule",
    "Matcher": ".rule",
    "Variant": ".rule",
    "apply_rules": ".rule",
    "rule_pass": ".rule",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
