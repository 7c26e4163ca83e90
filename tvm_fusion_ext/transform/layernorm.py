"""FuseBiasResidualLayerNorm: ``LayerNorm((x [+ bias]) + residual)`` → one ``fused_layernorm`` call.

Pattern
    ``layer_norm(add(add(x, bias), residual), gamma, beta)`` or ``layer_norm(add(x, residual), gamma, beta)``
    (decomposed LayerNorms are canonicalised to ``layer_norm`` earlier; adds match in either operand order);
    last, a plain ``layer_norm(x, gamma, beta)``: pre-norm blocks (ModernBERT) reuse the residual sum for the
    next residual, so the sum stays and only the normalisation fuses.
Check
    normalisation over the last axis only; gamma/beta are vectors of the row width; ``x`` and ``residual``
    have the output's shape (a broadcast residual is a different op); the bias is a per-column vector.
Rewrite
    ``fused_layernorm(x, residual, bias?, gamma, beta; eps)``: the row sum is formed once, in registers,
    instead of being written to memory and read back by a separate LayerNorm kernel.
"""

from __future__ import annotations

from typing import Optional

from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ..ops import call_op
from .bias import as_vector, per_column_bias_error
from .graph import format_dims, int_list, same_dims
from .rule import FusionRule, Match, Variant, rule_pass


class BiasResidualLayerNormRule(FusionRule):
    name = "FuseBiasResidualLayerNorm"
    kind = "layernorm"

    def variants(self):
        out = []
        for bias in (True, False):
            x, b, r, g, be = wildcard(), wildcard(), wildcard(), wildcard(), wildcard()
            s = is_op("relax.add")(is_op("relax.add")(x, b), r) if bias else is_op("relax.add")(x, r)
            root = is_op("relax.nn.layer_norm")(s, g, be)
            names = {"x": x, "residual": r, "gamma": g, "beta": be, "ln": root}
            if bias:
                names["bias"] = b
            out.append(Variant(root, names, {"bias": bias, "residual": True}, "relax.nn.layer_norm"))
        x, g, be = wildcard(), wildcard(), wildcard()
        root = is_op("relax.nn.layer_norm")(x, g, be)
        out.append(Variant(root, {"x": x, "gamma": g, "beta": be, "ln": root}, {"bias": False, "residual": False},
                           "relax.nn.layer_norm"))
        return out

    def check(self, m: Match) -> Optional[str]:
        out = m.dims("ln")  # rows may be symbolic (batch, sequence); the normalised width may not
        if out is None:
            return "shape is unknown"
        if not isinstance(out[-1], int):
            return f"normalised width {out[-1]} is symbolic"
        rank = len(out)
        axes = [a % rank for a in int_list(m["ln"].attrs.axes)]
        if axes != [rank - 1]:
            return f"normalises over axes {axes}, not the last axis only"
        if not (bool(m["ln"].attrs.center) and bool(m["ln"].attrs.scale)):
            return "layer_norm with centre or scale switched off"
        n = out[-1]
        for name in ("gamma", "beta"):
            shape = m.shape(name)
            if shape != [n]:
                return f"{name} of shape {shape} is not a vector of width {n}"
        for name in ("x", "residual") if m.tag["residual"] else ("x",):
            if not same_dims(m.dims(name), out):
                return f"{name} of shape {format_dims(m.dims(name) or [])} is broadcast to {format_dims(out)}"
            if m.dtype(name) != m.dtype("ln"):
                return f"{name} dtype {m.dtype(name)} differs from {m.dtype('ln')}"
        if m.tag["bias"]:
            reason = per_column_bias_error(m.shape("bias"), n, rank)
            if reason:
                return reason
        return None

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        attrs = m["ln"].attrs
        bias = as_vector(bb, m.arg("bias")) if m.tag["bias"] else None
        inputs = {"x": m.arg("x"), "residual": m.arg("residual") if m.tag["residual"] else None, "bias": bias,
                  "gamma": m.arg("gamma"), "beta": m.arg("beta")}
        return call_op(bb, "fused_layernorm", inputs, {"eps": float(attrs.epsilon)})

    def describe(self, m: Match) -> str:
        if not m.tag["residual"]:
            return "plain"
        return "bias + residual" if m.tag["bias"] else "residual"


def FuseBiasResidualLayerNorm():  # noqa: N802
    """Module pass: [(x [+ bias]) + residual →] LayerNorm  ⇒  ``fused_layernorm``."""
    return rule_pass("tfx.FuseBiasResidualLayerNorm", [BiasResidualLayerNormRule()])
