"""ONNX Runtime's normalisations with a residual, written as a sum and Relax's ``layer_norm`` / ``rms_norm``, the
ops the LayerNorm and RMSNorm rules read (with the residual add in front of them).

    SkipLayerNormalization(x, skip, γ[, β][, bias])      s = (x [+ bias]) + skip     y = LayerNorm(s)·γ [+ β]
    SkipSimplifiedLayerNormalization(x, skip, γ[, bias]) s = (x [+ bias]) + skip     y = s / √(mean(s²) + ε)·γ
    SimplifiedLayerNormalization(x, γ)  (ONNX domain)    y = x / √(mean(x², axes ≥ axis) + ε)·γ

Outputs as ONNX Runtime 1.32 computes them: ``mean`` and ``inv_std_var`` over the last axis, kept as ``[.., 1]``;
``input_skip_bias_sum`` is ``s``, bias included for both skip ops (the residual a pre-norm model carries on; TVM's
converter returned a scalar 0 for it). ``epsilon`` defaults to 1e-12 for the skip ops, 1e-5 for the simplified
one, as in ONNX Runtime's schemas. ``skip`` may be ``[S, H]`` or ``[1, S, H]`` (broadcast). Refused:
``SkipSimplifiedLayerNormalization``'s ``mean`` output (ONNX Runtime computes none), a ``stash_type`` other than
float32 statistics.
"""

from __future__ import annotations

from ..errors import Unsupported

_SKIP_EPSILON = 1e-12       # ONNX Runtime's schema default for both skip ops
_SIMPLIFIED_EPSILON = 1e-5  # and for SimplifiedLayerNormalization


def convert_skip_layer_norm(bb, inputs, attr, outputs):
    from tvm import relax

    x, skip, gamma, beta, bias = (inputs + [None] * 5)[:5]
    s = _residual_sum(bb, x, skip, bias)
    eps = float(attr.get("epsilon", _SKIP_EPSILON))
    if beta is None:
        beta = relax.op.zeros_like(gamma)
    y = relax.op.nn.layer_norm(s, gamma, beta, axes=[-1], epsilon=eps)
    if _wanted(outputs) == {0}:
        return y
    dtype = str(s.ty.dtype)
    mean = bb.emit(relax.op.mean(s, [-1], keepdims=True))
    centred = bb.emit(relax.op.subtract(s, mean))
    var = relax.op.mean(relax.op.multiply(centred, centred), [-1], keepdims=True)
    inv = relax.op.rsqrt(relax.op.add(var, relax.const(eps, dtype)))
    return relax.Tuple([y, mean, bb.emit(inv), s][: len(outputs)])


def convert_skip_rms_norm(bb, inputs, attr, outputs):
    from tvm import relax

    x, skip, gamma, bias = (inputs + [None] * 4)[:4]
    if 1 in _wanted(outputs):
        raise Unsupported("the mean output (ONNX Runtime computes none for the simplified norm)")
    s = _residual_sum(bb, x, skip, bias)
    eps = float(attr.get("epsilon", _SKIP_EPSILON))
    y = relax.op.nn.rms_norm(s, gamma, axes=[-1], epsilon=eps)
    if _wanted(outputs) == {0}:
        return y
    return relax.Tuple([y, relax.const(0.0, str(s.ty.dtype)), _inverse_rms(bb, s, [-1], eps), s][: len(outputs)])


def convert_rms_norm(bb, inputs, attr, outputs):
    """ONNX Runtime's ``SimplifiedLayerNormalization``: RMSNorm over the axes from ``axis`` on."""
    from tvm import relax

    x, gamma = bb.normalize(inputs[0]), inputs[1]
    if int(attr.get("stash_type", 1)) != 1:
        raise Unsupported(f"stash_type {attr['stash_type']} (statistics in a type other than float32)")
    rank = len(x.ty.shape.values)
    axes = list(range(int(attr.get("axis", -1)) % rank, rank))
    eps = float(attr.get("epsilon", _SIMPLIFIED_EPSILON))
    dtype = str(x.ty.dtype)
    xs = x if dtype == "float32" else bb.normalize(relax.op.astype(x, "float32"))
    gs = gamma if dtype == "float32" else relax.op.astype(gamma, "float32")
    y = relax.op.nn.rms_norm(xs, gs, axes=axes, epsilon=eps)
    y = y if dtype == "float32" else relax.op.astype(y, dtype)
    if _wanted(outputs) == {0}:
        return y
    return relax.Tuple([y, _inverse_rms(bb, xs, axes, eps)])


def _residual_sum(bb, x, skip, bias):
    """``(x + bias) + skip``: the residual rule's order (the bias belongs to the projection that made ``x``)."""
    from tvm import relax

    s = x if bias is None else relax.op.add(x, bias)
    return bb.normalize(relax.op.add(s, skip))


def _inverse_rms(bb, x, axes, eps):
    from tvm import relax

    ms = relax.op.mean(relax.op.multiply(x, x), axes, keepdims=True)
    return bb.emit(relax.op.rsqrt(relax.op.add(ms, relax.const(eps, str(x.ty.dtype)))))


def _wanted(outputs) -> set:
    """Positions of the outputs the graph names (an omitted optional output is "")."""
    return {i for i, name in enumerate(outputs) if name}
