"""ReadAttentionHeadsInPlace: attention reads Q, K and V as head ranges of the projection output they were split from.

Pattern
    a ``fused_attention`` whose ``q``, ``k`` or ``v`` operand (BSHD) is ``reshape(split(x, axis=-1)[i])``, any
    chain of reshapes: the heads of a fused QKV projection (:mod:`.qkv`), or of a model that exports one
    (GPT-2's ``c_attn``, Falcon, Phi). Each operand is looked at on its own; cross-attention's Q from one
    split and K/V from another both qualify.
Check
    the piece splits the last axis of ``x`` only into ``(heads, head dim)``, and both ``x``'s width and the
    piece's start are whole head dims, so that ``x`` viewed as ``[..., width / head dim, head dim]`` holds the
    operand's heads at a fixed head offset. A piece that does not start on a head boundary is refused (its
    heads straddle the view's).
Rewrite
    the same attention on ``reshape(x, [..., width / head dim, head dim])`` (a view: no copy) for each such
    operand, with ``heads`` / ``kv_heads`` and the ``*_head_start`` offsets set. The split then has no reader
    and is dropped: MiniLM spent 4 % of a call at 128 tokens copying its QKV output apart, one pass over
    memory the attention reads anyway. A split with other readers (a decoder's present K/V) stays.
"""

from __future__ import annotations

from typing import Dict, Optional

from tvm import relax, tirx

from ..ops import call_op
from ..ops.attention import head_axis
from .graph import FunctionGraph, op_name, shape_dims
from .report import HEADS_IN_PLACE_KIND
from .rule import Found, FusionRule, Match, Matcher, Variant, rule_pass

_OPERANDS = ("q", "k", "v")


def _split_piece(e: relax.Expr, graph: FunctionGraph) -> Optional[dict]:
    """``{"source", "start", "width"}`` when ``e`` is, through reshapes, piece ``i`` of a split of its source's
    last axis with static bounds; None otherwise."""
    value = graph.value(e)
    while op_name(value) == "relax.reshape":
        value = graph.value(value.args[0])
    if not isinstance(value, relax.TupleGetItem):
        return None
    split = graph.value(value.tuple_value)
    if op_name(split) != "relax.split":
        return None
    source = split.args[0]
    dims = shape_dims(source)
    if not dims or not isinstance(dims[-1], int) or int(split.attrs.axis) % len(dims) != len(dims) - 1:
        return None
    extent = dims[-1]
    sections = split.attrs.indices_or_sections
    if isinstance(sections, tirx.IntImm):  # n equal sections
        n = int(sections.value)
        bounds = [p * (extent // n) for p in range(n + 1)]
    elif all(isinstance(i, tirx.IntImm) for i in sections):
        bounds = [0] + [int(i) for i in sections] + [extent]
    else:
        return None  # a cut known only at run time
    i = int(value.index)
    if i + 1 >= len(bounds):
        return None
    return {"source": source, "start": bounds[i], "width": bounds[i + 1] - bounds[i]}


class HeadsOfOneSplit(Matcher):
    """A fused attention with at least one operand that is a piece of a split (see the module docstring)."""

    def match(self, root: relax.Var, graph: FunctionGraph) -> Optional[Found]:
        call = graph.fused_call(graph.var2val[root])
        if call is None or call[0] != "fused_attention":
            return None
        _, inputs, params = call
        if any(params.get(f"{n}_head_start") for n in _OPERANDS) or params.get("heads") is not None:
            return None  # already reads head ranges
        pieces = {}
        for name in _OPERANDS:
            piece = _split_piece(inputs[name], graph)
            if piece is not None and params.get(f"{name}_layout", "BSHD") == "BSHD":
                pieces[name] = piece
        if not pieces:
            return None
        return Found({"inputs": inputs, "params": params, "pieces": pieces})


def _view_error(name: str, operand, piece: dict) -> Optional[str]:
    heads, head_dim = shape_dims(operand)[-2:]  # static: the operator's contract
    if heads * head_dim != piece["width"]:  # a reshape that also regroups rows ([B, S, 384] → [B, 2S, 6, 32])
        return f"{name}'s {heads} × {head_dim} heads are not its split piece of width {piece['width']}"
    width = shape_dims(piece["source"])[-1]
    if piece["start"] % head_dim or width % head_dim:
        return (f"{name}'s piece starts at column {piece['start']} of {width}, not on a boundary of "
                f"{head_dim}-wide heads")
    # same element count and the last axis cut into (heads, head dim): the leading dims hold the source's rows
    return None


class AttentionHeadsInPlaceRule(FusionRule):
    name = "ReadAttentionHeadsInPlace"
    kind = HEADS_IN_PLACE_KIND

    def variants(self):
        return [Variant(HeadsOfOneSplit(), root_op="relax.call_tir")]

    def check(self, m: Match) -> Optional[str]:
        for name, piece in m["pieces"].items():
            reason = _view_error(name, m["inputs"][name], piece)
            if reason:
                return reason
        return None

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        inputs: Dict[str, relax.Expr] = {n: m.remap(e) for n, e in m["inputs"].items()}
        params = dict(m["params"])
        # the heads each operand holds now (static by the operator's contract), before any becomes a wider view
        held = {n: int(shape_dims(m["inputs"][n])[head_axis(params.get(f"{n}_layout", "BSHD"))]) for n in "qk"}
        params["heads"], params["kv_heads"] = held["q"], held["k"]
        views: Dict[tuple, relax.Expr] = {}
        for name, piece in m["pieces"].items():
            dims = shape_dims(m["inputs"][name])
            head_dim = dims[-1]
            key = (piece["source"], head_dim, tuple(str(d) for d in dims[:-2]))
            if key not in views:  # Q, K and V of one projection share one view
                width = shape_dims(piece["source"])[-1]
                views[key] = bb.emit(relax.op.reshape(m.remap(piece["source"]),
                                                      [*dims[:-2], width // head_dim, head_dim]),
                                     name_hint="qkv_heads")
            inputs[name] = views[key]
            params[f"{name}_head_start"] = piece["start"] // head_dim
        return call_op(bb, "fused_attention", inputs, params)

    def describe(self, m: Match) -> str:
        return "+".join(sorted(m["pieces"], key=_OPERANDS.index))


def ReadAttentionHeadsInPlace():  # noqa: N802
    """Module pass: attention on ``split`` pieces of one tensor  ⇒  attention reading head ranges of it."""
    return rule_pass("tfx.ReadAttentionHeadsInPlace", [AttentionHeadsInPlaceRule()])
