"""FuseGatedMLP: ``act(x @ Wg [+ bg]) ⊙ (x @ Wu [+ bu])`` → one ``fused_gated_dense`` call (SwiGLU, GeGLU).

Pattern (:class:`GatedProjections`, found at the multiply)
    ``multiply(a, b)`` in either operand order, where one operand is ``act(p_gate)`` with act among silu, gelu,
    gelu_tanh (exporter spellings, ``x · sigmoid(x)`` and the erf/tanh GELU forms, are canonicalised earlier)
    and both ``p_gate`` and the other operand are projections: ``matmul(x, W)`` or ``matmul(x,
    permute_dims(W))`` (torch Linear, ONNX Gemm transB), then optionally ``+ bias`` (either order); or the two
    halves of one such projection split in two along its last axis (Phi-3's merged ``gate_up_proj`` + chunk: a
    ``split``, or two last-axis slices in a legacy export).
Check (a refusal names its reason)
    both projections read the same ``x``; each weight is a 2-D constant (it is interleaved at compile time)
    and both have the same shape and dtype; biases are constant per-column vectors; exactly one side is
    activated (``act(g) ⊙ act(u)``, a bilinear ``g ⊙ u`` and ``act(g ⊙ u)`` are other functions); the matmuls
    keep the input dtype; nothing broadcasts the product; halves are the two different halves of one split.
Rewrite
    ``fused_gated_dense(x, [Wg | Wu] as (K, N, 2), [bg | bu] as (N, 2); act)``: gate and up accumulators of a
    column are computed together and only the product is stored. The down projection that follows is an
    ordinary dense layer (:mod:`.dense` fuses it).

Runs before :mod:`.qkv`, which would otherwise merge the gate and up projections (two constant-weight
projections of one input) into a matmul and split that this rule no longer sees as a gated MLP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import tvm
from tvm import relax

from ..ops import call_op
from ..ops.gated_dense import interleave_weights
from .bias import per_column_bias_error
from .graph import (FunctionGraph, const_value, explicit_out_dtype, format_dims, int_list, is_constant,
                    last_axis_slice, op_name, same_dims, shape_dims)
from .rule import Found, FusionRule, Match, Matcher, Variant, rule_pass

#: the gate activations a gated MLP uses, as Relax ops after canonicalisation
GATE_ACTIVATIONS = {"relax.nn.silu": "silu", "relax.nn.gelu": "gelu", "relax.nn.gelu_tanh": "gelu_tanh"}


@dataclass
class _Projection:
    """``x @ W [+ bias]`` as read from the graph (arrays are taken only once a match is accepted)."""

    x: relax.Expr
    matmul: relax.Call
    weight: relax.Expr  # the weight operand's value: a constant when the rule can take it
    transposed: bool  # read through permute_dims [1, 0]
    bias: Optional[relax.Expr] = None  # the bias operand's value
    covered: List[relax.Var] = field(default_factory=list)
    act: Optional[str] = None  # the activation applied to this projection, if any
    half: Optional[int] = None  # which half of a projection split in two along its last axis (merged gate_up)
    split: Optional[relax.Var] = None  # that split's binding


@dataclass
class GatedPlan:
    gate: _Projection
    up: _Projection
    reason: Optional[str] = None


class GatedProjections(Matcher):
    """A multiply of two projections of constant weights, at most one of them activated."""

    def match(self, root: relax.Var, graph: FunctionGraph) -> Optional[Found]:
        value = graph.var2val[root]
        sides = [_side(a, graph) for a in value.args]
        if any(s is None for s in sides):
            return None
        first, second = sides
        gate, up = (second, first) if second.act is not None and first.act is None else (first, second)
        plan = GatedPlan(gate, up)
        plan.reason = _check(plan, root, graph)
        return Found({"plan": plan, "x": gate.x}, gate.covered + up.covered)


def _side(e: relax.Expr, graph: FunctionGraph) -> Optional[_Projection]:
    """One operand of the multiply: a projection, through an optional gate activation."""
    if not isinstance(e, relax.Var):
        return None
    covered = graph.chain(e)
    value = graph.value(e)
    act = GATE_ACTIVATIONS.get(op_name(value))
    if act is not None:
        e = value.args[0]
        covered = covered + graph.chain(e)
        value = graph.value(e)
    half, split = None, None
    if isinstance(value, relax.TupleGetItem):
        split_value = graph.value(value.tuple_value)
        if not _is_halving(split_value) or not isinstance(value.tuple_value, relax.Var):
            return None
        half, split = int(value.index), value.tuple_value
        covered = covered + graph.chain(split)
        value = graph.value(split_value.args[0])
        covered = covered + graph.chain(split_value.args[0])
    elif _slice_half(value) is not None:  # the same halves as two Slices (a legacy export's torch.chunk)
        split, half = value.args[0], _slice_half(value)
        covered = covered + graph.chain(split)
        value = graph.value(split)
    p = _projection(value, graph)
    if p is None:
        return None
    p.act, p.half, p.split = act, half, split
    p.covered = covered + p.covered
    return p


def _is_halving(value) -> bool:
    """``split(t, 2, axis=-1)``: two equal halves of the last axis."""
    if op_name(value) != "relax.split":
        return False
    dims = shape_dims(value.args[0])
    sections = value.attrs.indices_or_sections
    if dims is None or not isinstance(dims[-1], int) or int(value.attrs.axis) % len(dims) != len(dims) - 1:
        return False
    if isinstance(sections, tvm.tirx.IntImm):
        return int(sections) == 2
    return int_list(sections) == [dims[-1] // 2] and dims[-1] % 2 == 0


def _slice_half(value) -> Optional[int]:
    """0 or 1 when ``value`` slices the first or second half of an even last axis (stride 1), else None."""
    found = last_axis_slice(value)
    dims = shape_dims(value.args[0]) if found is not None else None
    if dims is None or not isinstance(dims[-1], int) or dims[-1] % 2 or found[3] != 1:
        return None
    n = dims[-1]
    begin, end = (min(max(b + n if b < 0 else b, 0), n) for b in found[1:3])  # ONNX/numpy clamping
    return {(0, n // 2): 0, (n // 2, n): 1}.get((begin, end))


def _projection(value, graph: FunctionGraph) -> Optional[_Projection]:
    bias, covered = None, []
    if op_name(value) == "relax.add":
        for mm, b in ((value.args[0], value.args[1]), (value.args[1], value.args[0])):
            if op_name(graph.value(mm)) == "relax.matmul":
                bias, covered, value = graph.value(b), graph.chain(mm), graph.value(mm)
                break
        else:
            return None
    if op_name(value) != "relax.matmul":
        return None
    w, transposed = graph.value(value.args[1]), False
    if op_name(w) == "relax.permute_dims" and int_list(w.attrs.axes) in (None, [1, 0]):
        covered += graph.chain(value.args[1])
        w, transposed = graph.value(w.args[0]), True
    return _Projection(value.args[0], value, w, transposed, bias, covered)


def _check(plan: GatedPlan, root: relax.Var, graph: FunctionGraph) -> Optional[str]:
    gate, up = plan.gate, plan.up
    if gate.act is not None and up.act is not None:
        return f"both projections are activated ({gate.act}, {up.act}): not a gated unit"
    if gate.act is None:
        return "neither projection is activated: a bilinear product, not a gated unit"
    if not gate.x.same_as(up.x) and not graph.value(gate.x).same_as(graph.value(up.x)):
        return "the gate and up projections read different inputs"
    if (gate.split is None) != (up.split is None):
        return "one side is half of a split projection and the other is not"
    if gate.split is not None and (not gate.split.same_as(up.split) or gate.half == up.half):
        return "the two sides are not the two halves of one split projection"
    for name, p in (("gate", gate), ("up", up)):
        if not is_constant(p.weight):
            return f"the {name} weight is not a constant (it is interleaved with the other at compile time)"
        if p.weight.ty.ndim != 2:
            return f"the {name} weight has rank {p.weight.ty.ndim}: a batched matmul is not a dense layer"
    g_shape, u_shape = _kn(gate), _kn(up)
    if g_shape != u_shape:
        return f"gate weight is {format_dims(list(g_shape))} and up weight {format_dims(list(u_shape))} (as [K, N])"
    xs = shape_dims(gate.x)
    if xs is None or len(xs) < 2:
        return "the input is not a matrix of rows"
    if not isinstance(xs[-1], int) or xs[-1] != g_shape[0]:
        return f"input width {xs[-1]} does not match the weights' {g_shape[0]}"
    dtype = str(gate.x.ty.dtype)
    for name, p in (("gate", gate), ("up", up)):
        if str(p.weight.ty.dtype) != dtype:
            return f"the {name} weight is {p.weight.ty.dtype}, the input {dtype}"
        if explicit_out_dtype(p.matmul) not in (None, dtype):
            return f"the {name} matmul changes dtype to {explicit_out_dtype(p.matmul)}"
        if p.bias is not None:
            if not is_constant(p.bias):
                return f"the {name} bias is not a constant"
            reason = per_column_bias_error([int(d) for d in p.bias.ty.shape.values], _kn(p, whole=True)[1],
                                           len(xs))
            if reason:
                return f"{name}: {reason}"
            if str(p.bias.ty.dtype) != dtype:
                return f"the {name} bias is {p.bias.ty.dtype}, the input {dtype}"
    out = shape_dims(root)
    if not same_dims(out, [*xs[:-1], g_shape[1]]):
        return f"the product {format_dims(out or [])} is broadcast beyond the projections' shape"
    return None


def _kn(p: _Projection, whole: bool = False):
    """The weight's [K, N] (of this side's half, unless ``whole``)."""
    n0, n1 = (int(d) for d in p.weight.ty.shape.values)
    k, n = (n1, n0) if p.transposed else (n0, n1)
    return (k, n // 2) if p.half is not None and not whole else (k, n)


def _columns(p: _Projection, a: np.ndarray) -> np.ndarray:
    """This side's columns of a [..., N] array of the (whole) projection."""
    if p.half is None:
        return a
    n = a.shape[-1] // 2
    return a[..., p.half * n:(p.half + 1) * n]


def _weight(p: _Projection) -> np.ndarray:
    w = const_value(p.weight)
    return _columns(p, w.T if p.transposed else w)


def _bias(p: _Projection, n: int, dtype) -> np.ndarray:
    return np.zeros(n, dtype) if p.bias is None else _columns(p, const_value(p.bias).reshape(-1))


class GatedMLPRule(FusionRule):
    name = "FuseGatedMLP"
    kind = "gated_mlp"

    def variants(self) -> List[Variant]:
        return [Variant(GatedProjections(), root_op="relax.multiply")]

    def check(self, m: Match) -> Optional[str]:
        return m["plan"].reason

    def describe(self, m: Match) -> str:
        p: GatedPlan = m["plan"]
        parts = [f"act={p.gate.act}", f"N={_kn(p.gate)[1]}"]
        if p.gate.bias is not None or p.up.bias is not None:
            parts.append("bias")
        return ", ".join(parts)

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        p: GatedPlan = m["plan"]
        wg, wu = _weight(p.gate), _weight(p.up)
        bias = None
        if p.gate.bias is not None or p.up.bias is not None:
            n = wg.shape[1]
            bias = relax.const(np.stack([_bias(p.gate, n, wg.dtype), _bias(p.up, n, wg.dtype)], axis=-1))
        return call_op(bb, "fused_gated_dense",
                       {"x": m.arg("x"), "w": relax.const(interleave_weights(wg, wu)), "bias": bias},
                       {"act": p.gate.act})


def FuseGatedMLP() -> tvm.transform.Pass:  # noqa: N802  (TVM pass naming)
    """Module pass: ``act(x·Wg [+ bg]) ⊙ (x·Wu [+ bu])`` → ``fused_gated_dense`` over interleaved weights."""
    return rule_pass("tfx.FuseGatedMLP", [GatedMLPRule()])
