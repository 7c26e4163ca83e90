"""FuseRotaryEmbedding: ``x·cos + rot(x)·sin`` → one ``fused_rope`` call (which attention then absorbs).

Pattern (matched by meaning: :class:`RotaryMatcher`)
    ``add(multiply(x, cos), multiply(rot(x), sin))`` in any operand order, ``x`` 4-D, where ``rot`` is
    * rotate-half: ``concat([neg(x[..., D/2:]), x[..., :D/2]], axis=-1)``;
    * interleaved: ``reshape(concat([expand_dims(neg(x[..., 1::2])), expand_dims(x[..., 0::2])], -1), x.shape)``
      (or ``stack``), torch's ``stack((-x2, x1), -1).flatten(-2)``;
    and the negation is ``negative`` or a multiply by -1. ``cos``/``sin`` are any tensors (gathered from a
    cache by position ids, or computed from them): the operator reads whatever they hold.
Check
    the slices cut the last axis exactly as the style needs (a different rotation is refused with what it
    pairs); ``cos``/``sin`` broadcast to ``x`` without growing it, vary along the head dim fully and not along
    the heads axis; the positions axis (where ``cos`` varies) gives the layout BHSD or BSHD; dtypes agree.
Rewrite
    ``fused_rope(x, cos', sin'; style, layout)`` with ``cos'``/``sin'`` the tables viewed as (1 | B, 1 | S, D).
    The attention rule reads through this call (``attention_operands``): Q and K are then rotated where the
    fused attention reads them, and the standalone call is dropped as dead code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import tvm
from tvm import relax

from ..ops import call_op
from .graph import FunctionGraph, format_dims, last_axis_slice, op_name, same_dim, scalar_value, shape_dims
from .rule import Found, FusionRule, Match, Matcher, Variant, rule_pass



@dataclass
class RotaryPlan:
    x: Optional[relax.Expr] = None
    cos: Optional[relax.Expr] = None
    sin: Optional[relax.Expr] = None
    style: str = "half"
    layout: str = "BHSD"
    reason: Optional[str] = None


# ---------------------------------------------------------------------------------------------------
# the matcher
# ---------------------------------------------------------------------------------------------------

class RotaryMatcher(Matcher):
    """``x·cos + rot(x)·sin`` at an ``add``; the rule reads the :class:`RotaryPlan` as ``m["plan"]``."""

    def match(self, root: relax.Var, graph: FunctionGraph) -> Optional[Found]:
        add = graph.var2val[root]
        best = None
        for a, b in ((add.args[0], add.args[1]), (add.args[1], add.args[0])):
            for x, cos in _products(a, graph):
                for rotated, sin in _products(b, graph):
                    covered: List[relax.Var] = graph.chain(a) + graph.chain(b)
                    style, why = _rotation(rotated, x, graph, covered)
                    if style is None and why is None:
                        continue  # not a rotation of x at all
                    plan = RotaryPlan(x, cos, sin, style or "half", reason=why)
                    if why is None:
                        plan.reason = _check_tables(plan, graph)
                    found = Found({"plan": plan, "x": x, "cos": cos, "sin": sin}, covered)
                    if plan.reason is None:
                        return found
                    best = best or found
        return best


def _products(e, graph: FunctionGraph):
    """(tensor, factor) pairs of a multiply, both operand orders."""
    v = graph.value(e)
    if op_name(v) != "relax.multiply":
        return []
    return [(v.args[0], v.args[1]), (v.args[1], v.args[0])]


def _negated(e, graph: FunctionGraph, covered: list):
    """The operand of ``neg(t)`` or ``t · -1``, else None."""
    v = graph.value(e)
    if op_name(v) == "relax.negative":
        covered += graph.chain(e)
        return v.args[0]
    if op_name(v) == "relax.multiply":
        for t, c in ((v.args[0], v.args[1]), (v.args[1], v.args[0])):
            if scalar_value(graph.value(c)) == -1.0:
                covered += graph.chain(e)
                return t
    return None


def _slice_of(e, graph: FunctionGraph, covered: list):
    """``(source, begin, end, stride)`` of a strided_slice of the last axis, or of one part of a last-axis split
    (ONNX Runtime's optimizer writes rotate-half's two Slices as one Split); its bindings go to ``covered``."""
    found = last_axis_slice(graph.value(e))
    if found is None:
        found = _split_part(graph.value(e), graph, covered)
    if found is not None:
        covered += graph.chain(e)
    return found


def _split_part(v, graph: FunctionGraph, covered: list):
    """``(source, begin, end, 1)`` when ``v`` is part ``i`` of a ``split`` of the last axis at static indices."""
    if not isinstance(v, relax.TupleGetItem):
        return None
    split = graph.value(v.tuple_value)
    if op_name(split) != "relax.split":
        return None
    dims = shape_dims(split.args[0])
    if dims is None or not isinstance(dims[-1], int) or int(split.attrs.axis) % len(dims) != len(dims) - 1:
        return None
    sections = split.attrs.indices_or_sections
    if isinstance(sections, tvm.tirx.IntImm):  # n equal parts
        n = int(sections)
        if n <= 0 or dims[-1] % n:
            return None
        bounds = [dims[-1] // n * k for k in range(n + 1)]
    else:
        bounds = [0, *(int(i) for i in sections), dims[-1]]
    i = int(v.index)
    if not 0 <= i < len(bounds) - 1:
        return None
    covered += graph.chain(v.tuple_value)
    return split.args[0], bounds[i], bounds[i + 1], 1


def _same(a, b, graph: FunctionGraph) -> bool:
    return graph.value(a).same_as(graph.value(b)) or a.same_as(b)


def _rotation(rotated, x, graph: FunctionGraph, covered: list):
    """(style, None) when ``rotated`` is a rotation of ``x``; (None, reason) for a near miss; (None, None)
    when it is not a rotation of ``x`` at all."""
    dims = shape_dims(x)
    if dims is None or len(dims) != 4 or not isinstance(dims[-1], int):
        return None, None
    D = dims[-1]
    v = graph.value(rotated)
    op = op_name(v)
    if op == "relax.concat" and len(v.args[0].fields) == 2 and _last_axis(v, 4):
        first, second = v.args[0].fields
        neg = _negated(first, graph, covered)
        hi = _slice_of(neg, graph, covered) if neg is not None else None
        lo = _slice_of(second, graph, covered)
        if hi is None or lo is None or not _same(hi[0], x, graph) or not _same(lo[0], x, graph):
            return None, None
        covered += graph.chain(rotated)
        half = D // 2
        if D % 2 == 0 and (hi[1], min(hi[2], D), hi[3]) == (half, D, 1) and (lo[1], min(lo[2], D), lo[3]) == (0, half, 1):
            return "half", None
        return None, (f"rotation pairs x[{hi[1]}:{min(hi[2], D)}:{hi[3]}] with x[{lo[1]}:{min(lo[2], D)}:{lo[3]}], "
                      f"not the two halves of the head dim {D}")
    if op == "relax.reshape":
        inner = graph.value(v.args[0])
        parts = None
        if op_name(inner) == "relax.concat" and len(inner.args[0].fields) == 2 and _last_axis(inner, 5):
            parts = [_unsqueezed(f, graph, covered) for f in inner.args[0].fields]
        elif op_name(inner) == "relax.stack" and len(inner.args[0].fields) == 2 and _last_axis(inner, 5):
            parts = list(inner.args[0].fields)
        if parts is None or any(p is None for p in parts):
            return None, None
        neg = _negated(parts[0], graph, covered)
        odd = _slice_of(neg, graph, covered) if neg is not None else None
        even = _slice_of(parts[1], graph, covered)
        if odd is None or even is None or not _same(odd[0], x, graph) or not _same(even[0], x, graph):
            return None, None
        covered += graph.chain(rotated) + graph.chain(v.args[0])
        if (odd[1], odd[3], even[1], even[3]) == (1, 2, 0, 2) and odd[2] >= D - 1 and even[2] >= D - 1 \
                and D % 2 == 0:
            return "interleaved", None
        return None, (f"interleaved rotation reads x[{odd[1]}::{odd[3]}] and x[{even[1]}::{even[3]}], "
                      "not the odd and even elements")
    return None, None


def _last_axis(call, rank: int) -> bool:
    axis = call.attrs.axis
    return axis is not None and int(axis) % rank == rank - 1


def _unsqueezed(e, graph: FunctionGraph, covered: list):
    v = graph.value(e)
    if op_name(v) != "relax.expand_dims":
        return None
    axes = [int(a) for a in v.attrs.axis]
    if len(axes) != 1 or axes[0] % 5 != 4:
        return None
    covered += graph.chain(e)
    return v.args[0]


# ---------------------------------------------------------------------------------------------------
# the check, worked out while matching
# ---------------------------------------------------------------------------------------------------

def _check_tables(plan: RotaryPlan, graph: FunctionGraph) -> Optional[str]:
    xd = shape_dims(plan.x)
    x_dtype = str(plan.x.ty.dtype)
    if not x_dtype.startswith(("float", "bfloat")):
        return f"x is {x_dtype}, not floating point"
    layouts = {"BHSD", "BSHD"}
    for name in ("cos", "sin"):
        t = getattr(plan, name)
        td = shape_dims(t)
        if td is None or len(td) > 4:
            return f"{name} has no known shape of rank <= 4"
        if str(t.ty.dtype) != x_dtype:
            return f"{name} is {t.ty.dtype}, x is {x_dtype}"
        full = [1] * (4 - len(td)) + list(td)
        for axis, (c, want) in enumerate(zip(full, xd)):
            if not (same_dim(c, 1) or same_dim(c, want)):
                return f"{name} of shape {format_dims(td)} does not broadcast to x {format_dims(xd)}"
        if not same_dim(full[3], xd[3]):
            return f"{name} of shape {format_dims(td)} does not hold one value per head-dim element"
        # the positions axis is where the table varies; the heads axis is where it must not
        if not same_dim(full[1], 1):
            layouts.discard("BHSD")
        if not same_dim(full[2], 1):
            layouts.discard("BSHD")
    if not layouts:
        return "cos/sin vary along both middle axes: no axis is the heads axis"
    plan.layout = "BHSD" if "BHSD" in layouts else "BSHD"
    return None


def table_view(plan: RotaryPlan, t: relax.Expr, x_dims) -> list:
    """The (1 | B, 1 | S, D) shape the operator reads ``t`` as (its heads axis, of size 1, dropped)."""
    td = shape_dims(t)
    full = [1] * (4 - len(td)) + list(td)
    b, s = (0, 2) if plan.layout == "BHSD" else (0, 1)
    return [full[b], full[s], full[3]]


# ---------------------------------------------------------------------------------------------------
# the rule
# ---------------------------------------------------------------------------------------------------

class RotaryEmbeddingRule(FusionRule):
    name = "FuseRotaryEmbedding"
    kind = "rope"

    def variants(self) -> List[Variant]:
        return [Variant(RotaryMatcher(), root_op="relax.add")]

    def check(self, m: Match) -> Optional[str]:
        return m["plan"].reason

    def describe(self, m: Match) -> str:
        return f"{m['plan'].style}, {m['plan'].layout}"

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        plan: RotaryPlan = m["plan"]
        x_dims = shape_dims(plan.x)
        tables = {}
        for name in ("cos", "sin"):
            t = m.arg(name)
            view = table_view(plan, m[name], x_dims)
            if [*shape_dims(t)] != view:
                t = bb.emit(relax.op.reshape(t, view), name_hint=f"rope_{name}")
            tables[name] = t
        return call_op(bb, "fused_rope", {"x": m.arg("x"), **tables}, {"style": plan.style, "layout": plan.layout})


def FuseRotaryEmbedding() -> tvm.transform.Pass:  # noqa: N802  (TVM pass naming)
    """Module pass: ``x·cos + rot(x)·sin`` → ``fused_rope``."""
    return rule_pass("tfx.FuseRotaryEmbedding", [RotaryEmbeddingRule()])
