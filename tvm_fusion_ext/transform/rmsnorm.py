"""FuseRMSNorm: ``x · rsqrt(mean(x², last axis) + eps) · γ`` in any spelling → one ``fused_rmsnorm`` call.

Pattern (matched by meaning: :class:`RMSNormMatcher`, found at the last binding of the norm)
    ``[cast] (γ · [cast] n)`` or ``[cast] n`` (γ on either side), where the normalised value ``n`` is
    ``xf · r`` with ``r = rsqrt(s) | 1 / sqrt(s)`` (ONNX ``Reciprocal`` imports as ``1 / ·``), or ``xf / sqrt(s)``;
    ``s = mean(xf², axis=-1, keepdims) [+ eps]`` with ``xf² = xf ** 2 | xf · xf``; ``xf = [cast to fp32] x``, the
    fp32 casts exporters emit around the statistics of a 16-bit model. Or Relax's ``rms_norm(xf, γ)`` (ONNX's
    ``RMSNormalization``, opset 23). With ``residual``: ``x = a + b`` as well
    (pre-norm blocks reuse that sum for the next residual: then the sum stays and the plain variant fuses).
Check (a refusal names its reason)
    the mean reduces exactly the last axis and keeps it; the squared tensor is the normalised one (a mean over
    a different tensor is another computation); the exponent is 2; eps a scalar constant ≥ 0 (absent: 0); γ one value
    per feature; a residual's operands have the result's shape (no broadcast) and dtype.
Rewrite
    ``fused_rmsnorm(x [, residual], γ; eps, out_dtype)``: statistics in fp32, one rounding to the result type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import tvm
from tvm import relax

from ..ops import call_op
from .graph import FunctionGraph, format_dims, op_name, same_dim, same_dims, scalar_value, shape_dims
from .rule import Found, FusionRule, Match, Matcher, Variant, rule_pass


@dataclass
class RMSNormPlan:
    x: Optional[relax.Expr] = None
    residual: Optional[relax.Expr] = None
    gamma: Optional[relax.Expr] = None
    eps: float = 0.0
    reason: Optional[str] = None
    covered: List[relax.Var] = field(default_factory=list)


class RMSNormMatcher(Matcher):
    """An RMSNorm ending at ``root``; ``with_residual`` asks for the ``a + b`` before it as well."""

    def __init__(self, with_residual: bool):
        self.with_residual = with_residual

    def match(self, root: relax.Var, graph: FunctionGraph) -> Optional[Found]:
        value = graph.var2val[root]
        covered: List[relax.Var] = []
        if op_name(value) == "relax.astype":  # the cast back to the model's dtype
            inner = value.args[0]
            covered += graph.chain(inner)
            value = graph.value(inner)
        op, plan = op_name(value), None
        if op == "relax.nn.rms_norm":
            plan = _rms_norm_op(value, graph, covered)
        elif op == "relax.multiply":
            # ``γ · n`` with γ on either side, or the product is ``n = xf · r`` itself (no γ). Each reading that
            # parses is a candidate and the first one that passes the checks wins: a weightless norm
            # ``xf · (1 / sqrt(s))`` also parses as γ = xf times "n" = ``1 / sqrt(s)`` (a refused mean over
            # another tensor), and one applied to a previous weightless norm's output (NanoChat's norm of the
            # normed embeddings) as that output times a γ of shape [B, S, 1]; taking the first parse refused both
            candidates = []
            for normed, gamma in ((value.args[0], value.args[1]), (value.args[1], value.args[0])):
                reading = _normalised(normed, graph, list(covered) + graph.chain(normed))
                if reading is not None:
                    reading.gamma = gamma
                    candidates.append(reading)
            reading = _normalised_value(value, graph, covered)
            if reading is not None:
                candidates.append(reading)
            plan = next((c for c in candidates if c.reason is None and _check(c, root) is None),
                        candidates[0] if candidates else None)
        elif op == "relax.divide":
            plan = _normalised_value(value, graph, covered)
        if plan is None:
            return None
        if self.with_residual:
            x = graph.value(plan.x)
            if op_name(x) != "relax.add":
                return None
            plan.covered += graph.chain(plan.x)
            plan.x, plan.residual = x.args
        plan.reason = plan.reason or _check(plan, root)
        exprs = {"plan": plan, "x": plan.x}
        if plan.residual is not None:
            exprs["residual"] = plan.residual
        if plan.gamma is not None:
            exprs["gamma"] = plan.gamma
        return Found(exprs, plan.covered)


def _rms_norm_op(v, graph: FunctionGraph, covered: list) -> RMSNormPlan:
    """Relax's own ``rms_norm(x, γ)``: what ONNX's ``RMSNormalization`` (opset 23) imports as."""
    plan = RMSNormPlan(gamma=v.args[1], eps=float(v.attrs.epsilon), covered=list(covered))
    _set_input(plan, v.args[0], graph)
    dims = shape_dims(v.args[0])
    axes = None if dims is None else [int(a) % len(dims) for a in v.attrs.axes]
    if dims is None:
        plan.reason = "the normalised tensor has no known shape"
    elif axes != [len(dims) - 1]:
        plan.reason = f"rms_norm over axes {axes}, not only the last axis of a rank-{len(dims)} tensor"
    else:
        plan.reason = _eps_reason(plan.eps)
    return plan


def _set_input(plan: RMSNormPlan, xf, graph: FunctionGraph) -> None:
    """``plan.x``: ``xf`` itself, or what it casts to fp32 (the statistics of a 16-bit model; the op keeps them in
    fp32 itself, so the cast is covered)."""
    cast = graph.value(xf)
    if op_name(cast) == "relax.astype" and str(cast.attrs.dtype) == "float32":
        plan.covered += graph.chain(xf)
        xf = cast.args[0]
    plan.x = xf


def _normalised(e, graph: FunctionGraph, covered: list) -> Optional[RMSNormPlan]:
    """``e`` (a bound value, through an optional cast) as the normalised ``xf · r``, else None."""
    v = graph.value(e)
    if op_name(v) == "relax.astype":
        covered = covered + graph.chain(v.args[0])
        v = graph.value(v.args[0])
    return _normalised_value(v, graph, covered)


def _normalised_value(v, graph: FunctionGraph, covered: list) -> Optional[RMSNormPlan]:
    op = op_name(v)
    if op == "relax.multiply":
        for xf, r in ((v.args[0], v.args[1]), (v.args[1], v.args[0])):
            inner: List[relax.Var] = []
            s = _inverse_root(r, graph, inner)
            if s is not None:
                return _statistics(xf, s, graph, covered + inner)
        return None
    if op == "relax.divide":
        root = graph.value(v.args[1])
        if op_name(root) == "relax.sqrt":
            return _statistics(v.args[0], root.args[0], graph, covered + graph.chain(v.args[1]))
    return None


def _inverse_root(r, graph: FunctionGraph, covered: list):
    """``s`` when ``r`` is ``rsqrt(s)`` or ``1 / sqrt(s)`` (its bindings go to ``covered``), else None."""
    v = graph.value(r)
    if op_name(v) == "relax.rsqrt":
        covered += graph.chain(r)
        return v.args[0]
    if op_name(v) == "relax.divide" and scalar_value(graph.value(v.args[0])) == 1.0:
        root = graph.value(v.args[1])
        if op_name(root) == "relax.sqrt":
            covered += graph.chain(r) + graph.chain(v.args[1])
            return root.args[0]
    return None


def _statistics(xf, s, graph: FunctionGraph, covered: list) -> Optional[RMSNormPlan]:
    """The plan when ``s`` is ``mean(xf², last axis) + eps``; None when it is no mean of squares at all."""
    sv = graph.value(s)
    if op_name(sv) == "relax.add":
        candidates = ((sv.args[0], sv.args[1]), (sv.args[1], sv.args[0]))
    elif op_name(sv) == "relax.mean":
        candidates = ((s, None),)  # no eps at all (Helium's dynamo export): eps = 0
    else:
        return None
    for var, eps in candidates:
        mean = graph.value(var)
        if op_name(mean) != "relax.mean":
            continue
        square = graph.value(mean.args[0])
        squared, exponent = None, None
        if op_name(square) == "relax.power":
            squared, exponent = square.args[0], scalar_value(graph.value(square.args[1]))
        elif op_name(square) == "relax.multiply" and _same(square.args[0], square.args[1], graph):
            squared, exponent = square.args[0], 2.0
        if squared is None:
            continue
        plan = RMSNormPlan(covered=covered + graph.chain(s) + (graph.chain(var) if eps is not None else [])
                           + graph.chain(mean.args[0]))
        _set_input(plan, xf, graph)
        plan.eps = scalar_value(graph.value(eps)) if eps is not None else 0.0
        if not _same(squared, xf, graph):
            plan.reason = "the mean is over the square of another tensor than the one normalised"
        elif exponent != 2.0:
            plan.reason = f"the variance uses exponent {exponent}, not 2"
        else:
            plan.reason = _mean_axis_reason(mean, xf) or _eps_reason(plan.eps)
        return plan
    return None


def _same(a, b, graph: FunctionGraph) -> bool:
    return a.same_as(b) or graph.value(a).same_as(graph.value(b))


def _mean_axis_reason(mean, xf) -> Optional[str]:
    dims = shape_dims(xf)
    if dims is None:
        return "the normalised tensor has no known shape"
    axes = None if mean.attrs.axis is None else [int(a) % len(dims) for a in mean.attrs.axis]
    if axes != [len(dims) - 1]:
        return f"the mean reduces axes {axes}, not only the last axis of a rank-{len(dims)} tensor"
    if not mean.attrs.keepdims:
        return "the mean does not keep the reduced axis"
    return None


def _eps_reason(eps) -> Optional[str]:
    if eps is None:
        return "eps is not a scalar constant"
    if not eps >= 0.0:  # eps = 0 is the same formula (an all-zero row gives NaN either way)
        return f"eps is {eps:g}, negative"
    return None


def _check(plan: RMSNormPlan, root: relax.Var) -> Optional[str]:
    out = shape_dims(root)
    x_dims = shape_dims(plan.x)
    if out is None or x_dims is None:
        return "shapes are unknown"
    if not isinstance(out[-1], int):
        return f"normalised width {out[-1]} is symbolic"
    if not str(plan.x.ty.dtype).startswith(("float", "bfloat")):
        return f"x is {plan.x.ty.dtype}, not floating point"
    for name in ("x", "residual"):
        t = getattr(plan, name)
        if t is not None and (not same_dims(shape_dims(t), out) or str(t.ty.dtype) != str(plan.x.ty.dtype)):
            return f"{name} of shape {format_dims(shape_dims(t) or [])} {t.ty.dtype} is broadcast or cast to the " \
                   f"result {format_dims(out)}"
    if plan.gamma is not None:
        g = shape_dims(plan.gamma)
        if g is None or not g or not same_dim(g[-1], out[-1]) or any(not same_dim(d, 1) for d in g[:-1]) \
                or len(g) > len(out):
            return f"gamma of shape {format_dims(g or [])} is not one value per feature of width {out[-1]}"
    return None


class RMSNormRule(FusionRule):
    name = "FuseRMSNorm"
    kind = "rmsnorm"

    def variants(self) -> List[Variant]:
        # the residual variant first: the larger match, refused (the leak check) where the sum is reused
        return [Variant(RMSNormMatcher(True), tag={"residual": True}),
                Variant(RMSNormMatcher(False), tag={"residual": False})]

    def check(self, m: Match) -> Optional[str]:
        return m["plan"].reason

    def describe(self, m: Match) -> str:
        p: RMSNormPlan = m["plan"]
        parts = [f"eps={p.eps:.3g}"]
        if p.residual is not None:
            parts.append("residual")
        if p.gamma is None:
            parts.append("no gamma")
        return ", ".join(parts)

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        p: RMSNormPlan = m["plan"]
        gamma = None
        if p.gamma is not None:
            gamma = m.arg("gamma")
            if gamma.ty.ndim != 1:  # [1, …, 1, N]: the same values as a vector (a free view)
                gamma = bb.emit(relax.op.reshape(gamma, [shape_dims(m.root_var)[-1]]), name_hint="rms_gamma")
        inputs = {"x": m.arg("x"), "residual": m.arg("residual") if p.residual is not None else None, "gamma": gamma}
        return call_op(bb, "fused_rmsnorm", inputs, {"eps": float(p.eps), "out_dtype": str(m.root_var.ty.dtype)})


def FuseRMSNorm() -> tvm.transform.Pass:  # noqa: N802  (TVM pass naming)
    """Module pass: RMSNorm in any exporter spelling (+ an optional residual add) → ``fused_rmsnorm``."""
    return rule_pass("tfx.FuseRMSNorm", [RMSNormRule()])
