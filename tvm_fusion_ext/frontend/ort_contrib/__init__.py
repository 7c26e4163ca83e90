"""ONNX Runtime's contrib ops (``com.microsoft``), as ``onnxruntime.transformers.optimizer`` writes them into a
model, converted into the plain graphs the fusion rules read.

TVM 0.27's importer has converters for a few of these ops, keyed by name alone and never checked against ONNX
Runtime: its ``Attention`` reads no 1-D ``mask_index`` (the form ``EmbedLayerNormalization`` produces) and
crashes on a dynamic batch, its ``SkipLayerNormalization`` returns placeholder zeros for the residual sum a
pre-norm model reads, its ``EmbedLayerNormalization`` fails on symbolic dims. Every ``com.microsoft`` node is
therefore converted here, one module per family, each keeping ONNX Runtime's CPU semantics:

* :mod:`.attention`: ``Attention``, ``MultiHeadAttention`` as ``softmax(q·kᵀ·scale + mask)·v`` (the form
  :mod:`..converters.attention` writes);
* :mod:`.norms`: ``SkipLayerNormalization``, ``SkipSimplifiedLayerNormalization``, ``SimplifiedLayerNormalization``
  (registered by ONNX Runtime in the ONNX domain) as a sum and ``layer_norm`` / ``rms_norm``;
* :mod:`.embedding`: ``EmbedLayerNormalization`` as gathers, a sum and ``layer_norm``;
* :mod:`.elementwise`: ``Gelu``, ``BiasGelu``, ``FastGelu``, ``QuickGelu``, ``BiasAdd``, ``FusedMatMul``.

A converter takes ``(bb, inputs, attr, outputs)`` (``outputs``: the node's output names, "" for one left out) and
raises :class:`..errors.Unsupported` for what it cannot convert exactly (a KV cache, rotary attention, ...):
the importer turns that into a one-line refusal naming the op and node. Submodules are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Optional

#: com.microsoft op -> "module.function" converting it
_CONVERTERS = {
    "Attention": "attention.convert_attention",
    "MultiHeadAttention": "attention.convert_multi_head_attention",
    "SkipLayerNormalization": "norms.convert_skip_layer_norm",
    "SkipSimplifiedLayerNormalization": "norms.convert_skip_rms_norm",
    "EmbedLayerNormalization": "embedding.convert_embed_layer_norm",
    "Gelu": "elementwise.convert_gelu",
    "BiasGelu": "elementwise.convert_bias_gelu",
    "FastGelu": "elementwise.convert_fast_gelu",
    "QuickGelu": "elementwise.convert_quick_gelu",
    "BiasAdd": "elementwise.convert_bias_add",
    "FusedMatMul": "elementwise.convert_fused_matmul",
}
#: ops ONNX Runtime registers in the ONNX domain ("") although ONNX has no such op
_ONNX_DOMAIN_CONVERTERS = {"SimplifiedLayerNormalization": "norms.convert_rms_norm"}

MICROSOFT_OPS = frozenset(_CONVERTERS)
ONNX_DOMAIN_OPS = frozenset(_ONNX_DOMAIN_CONVERTERS)
_DEFAULT_DOMAINS = ("", "ai.onnx")


def is_contrib(node) -> bool:
    """Whether ``node`` is an ONNX Runtime op converted here (by domain and name)."""
    return _converter_of(node.domain, node.op_type) is not None


def _converter_of(domain: str, op: str) -> Optional[str]:
    if domain == "com.microsoft":
        return _CONVERTERS.get(op)
    if domain in _DEFAULT_DOMAINS:
        return _ONNX_DOMAIN_CONVERTERS.get(op)
    return None


def convert(domain: str, op: str, bb, inputs, attr, outputs):
    """The Relax expression for one contrib node (a tuple when it has several outputs)."""
    module, function = _converter_of(domain, op).split(".")
    convert_node = getattr(importlib.import_module(f"{__name__}.{module}"), function)
    return convert_node(bb, list(inputs), attr, tuple(outputs))


def unsupported_reason(node) -> Optional[str]:
    """Why an ONNX Runtime node that is not converted here is refused (None for other domains)."""
    if node.domain == "com.microsoft.nchwc":
        return ("ONNX Runtime's NCHWc layout ops are written by its opt_level 99 for the CPU it ran on and are not "
                "portable; optimize with opt_level 2 or lower")
    if node.domain == "com.microsoft":
        return (f"ONNX Runtime contrib op with no converter here (converted: {', '.join(sorted(MICROSOFT_OPS))}); "
                f"optimize with fewer fusions or export without ONNX Runtime's optimizer")
    return None


__all__ = ["MICROSOFT_OPS", "ONNX_DOMAIN_OPS", "convert", "is_contrib", "unsupported_reason"]
