"""FuseMatmulBiasActivation: ``act(x @ W [+ bias])`` → one ``fused_dense`` call.

Pattern
    ``matmul(x, W)`` or ``matmul(x, permute_dims(W, [1, 0]))`` (ONNX Gemm transB, torch Linear),
    then optionally ``add(·, bias)`` (either operand order), then optionally one activation among
    relu, gelu, gelu_tanh, silu, sigmoid, tanh (exporter spellings of GELU/SiLU are canonicalised earlier).
Check
    x has rank ≥ 2, W is 2-D (a batched matmul is not a dense layer), the matmul does not change dtype,
    the bias is a per-output-column vector (shape [N] or [1, …, 1, N] that does not broadcast the output
    to a larger shape), dtypes agree.
Rewrite
    ``fused_dense(x, W, bias?; act, transpose_b)``; a [1, …, N] bias is reshaped to [N] (a free view).
"""

from __future__ import annotations

from typing import Optional

from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ..ops import call_op
from .bias import as_vector, per_column_bias_error
from .graph import explicit_out_dtype, format_dims, int_list
from .rule import FusionRule, Match, Variant, rule_pass

ACTIVATION_OPS = {
    "relax.nn.relu": "relu",
    "relax.nn.gelu": "gelu",
    "relax.nn.gelu_tanh": "gelu_tanh",
    "relax.nn.silu": "silu",
    "relax.sigmoid": "sigmoid",
    "relax.tanh": "tanh",
}


class MatmulBiasActivationRule(FusionRule):
    name = "FuseMatmulBiasActivation"
    kind = "dense"

    def variants(self):
        out = []
        acts = list(ACTIVATION_OPS.items()) + [(None, "none")]
        for act_op, act in acts:  # activation first: the largest pattern wins at its root
            for bias in (True, False):
                for trans in (True, False):  # absorbing the transpose is the larger match
                    x, w, b = wildcard(), wildcard(), wildcard()
                    wt = is_op("relax.permute_dims")(w) if trans else w
                    mm = is_op("relax.matmul")(x, wt)
                    y = is_op("relax.add")(mm, b) if bias else mm
                    root = is_op(act_op)(y) if act_op else y
                    names = {"x": x, "w": w, "mm": mm}
                    if bias:
                        names["bias"] = b
                    if trans:
                        names["wt"] = wt
                    root_op = act_op or ("relax.add" if bias else "relax.matmul")
                    out.append(Variant(root, names, {"act": act, "bias": bias, "transpose_b": trans}, root_op))
        return out

    def check(self, m: Match) -> Optional[str]:
        # the rows (batch, sequence) may be symbolic; the weight, being a layer's parameters, is not
        xs, w_dims = m.dims("x"), m.dims("w")
        if xs is None or w_dims is None:
            return "operand shapes are unknown"
        if len(w_dims) != 2:
            return f"weight has rank {len(w_dims)}: a batched matmul is not a dense layer"
        ws = m.shape("w")
        if ws is None:
            return f"weight shape {format_dims(w_dims)} is not static"
        if not isinstance(xs[-1], int):
            return f"input width {xs[-1]} is symbolic"
        if len(xs) < 2:
            return "input is a vector: matmul semantics differ from a dense layer"
        if m.dtype("x") != m.dtype("w"):
            return f"input dtype {m.dtype('x')} differs from weight dtype {m.dtype('w')}"
        out_dtype = explicit_out_dtype(m["mm"])
        if out_dtype not in (None, m.dtype("x")):
            return f"matmul changes dtype to {out_dtype}"
        if m.tag["transpose_b"]:
            axes = int_list(m["wt"].attrs.axes)
            if axes not in (None, [1, 0]):
                return f"weight permutation {axes} is not a transpose"
        n = ws[0] if m.tag["transpose_b"] else ws[1]
        if m.tag["bias"]:
            reason = per_column_bias_error(m.shape("bias"), n, len(xs))
            if reason:
                return reason
            if m.dtype("bias") != m.dtype("x"):
                return f"bias dtype {m.dtype('bias')} differs from input dtype {m.dtype('x')}"
        return None

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        bias = as_vector(bb, m.arg("bias")) if m.tag["bias"] else None
        return call_op(bb, "fused_dense", {"x": m.arg("x"), "w": m.arg("w"), "bias": bias},
                       {"act": m.tag["act"], "transpose_b": bool(m.tag["transpose_b"])})

    def describe(self, m: Match) -> str:
        parts = [f"act={m.tag['act']}"]
        if m.tag["bias"]:
            parts.append("bias")
        if m.tag["transpose_b"]:
            parts.append("transposed weight")
        return ", ".join(parts)


def FuseMatmulBiasActivation():  # noqa: N802  (TVM pass naming)
    """Module pass: matmul + optional bias + optional activation → ``fused_dense``."""
    return rule_pass("tfx.FuseMatmulBiasActivation", [MatmulBiasActivationRule()])
