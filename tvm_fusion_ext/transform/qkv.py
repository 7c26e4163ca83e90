"""FuseQKVProjection: projections of one input by constant weights → one matmul on concatenated weights.

Pattern
    two or more ``matmul(x, W_i)`` (optionally ``+ b_i``) in one dataflow block reading the same ``x``, with
    ``W_i`` a constant (or ``permute_dims`` of one, as ONNX Gemm transB imports): the Q, K and V projections of
    attention. A multi-root match, found at the first projection; its roots are the projections' results.
Check
    every weight is a 2-D constant with the same K and dtype (a non-constant weight cannot be concatenated at
    compile time: refused with a reason). A bias is absorbed only when it is a constant per-column vector
    and the matmul's only user is that add; otherwise the add stays where it is.
Rewrite
    ``y = matmul(x, concat(W_i)) [+ concat(b_i)]`` and ``split(y)``; each projection becomes one piece of the
    split. Dense fusion then turns the single matmul+bias into one ``fused_dense`` that reads ``x`` once.

Stock ``relax.transform.CombineParallelMatmul`` does the same only when the weights are function
parameters; ONNX imports bind them as constants, hence this rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional

import numpy as np
import tvm
from tvm import relax

from .bias import per_column_bias_error
from .graph import (FunctionGraph, const_value, explicit_out_dtype, int_list, is_constant, op_name, same_dims,
                    shape_dims)
from .rule import Found, FusionRule, Match, Matcher, Variant, rule_pass


@dataclass
class _Projection:
    matmul: relax.Var  # the matmul binding
    weight: np.ndarray  # [K, N], already un-transposed (read only for a group that merges: weights are large)
    bias: Optional[np.ndarray] = None  # [N] when the add after the matmul is absorbed
    add: Optional[relax.Var] = None  # that add's binding

    @property
    def result(self) -> relax.Var:
        """The binding the projection's piece of the split replaces."""
        return self.add if self.add is not None else self.matmul


@dataclass
class _Group:
    projections: List[_Projection] = field(default_factory=list)  # the ones that can be merged
    refusal: Optional[str] = None  # why a projection of x could not take part


class ParallelProjections(Matcher):
    """Every matmul of one ``x`` in the block, found at the first that can take part."""

    def match(self, root: relax.Var, graph: FunctionGraph) -> Optional[Found]:
        x = graph.var2val[root].args[0]
        if not isinstance(x, relax.Var):
            return None
        matmuls = _matmuls_of(x, graph.position[root][0], graph)
        if len(matmuls) < 2:
            return None
        members, refusal = [], None
        for mm in matmuls:
            error = _projection_error(mm, x, graph)
            if error is None:
                members.append(mm)
            else:
                refusal = refusal or error
        mergeable = len(members) >= 2
        # found once per group: at its first member when it merges, at its first matmul when it is refused
        if not root.same_as(members[0] if mergeable else matmuls[0]):
            return None
        group = _Group(refusal=refusal)
        if not mergeable:
            return Found({"x": x, "group": group})
        for mm in members:
            weight = _weight_of(graph.var2val[mm].args[1], graph)
            array = const_value(weight.const)
            group.projections.append(_Projection(mm, array.T if weight.transposed else array))
        for p in group.projections:
            _absorb_bias(p, graph)
        covered = [p.matmul for p in group.projections if p.add is not None]
        return Found({"x": x, "group": group}, covered, [p.result for p in group.projections])


def _matmuls_of(x: relax.Var, block: int, graph: FunctionGraph) -> List[relax.Var]:
    """The matmul bindings of ``block`` whose left operand is ``x``, in binding order."""
    out = [u for u in graph.users(x)
           if u is not None and graph.position[u][0] == block and op_name(graph.var2val.get(u)) == "relax.matmul"
           and graph.var2val[u].args[0].same_as(x)]
    return sorted(out, key=graph.position.get)


def _projection_error(mm: relax.Var, x: relax.Var, graph: FunctionGraph) -> Optional[str]:
    call = graph.var2val[mm]
    w = _weight_of(call.args[1], graph)
    if w is None or w.const.ty.ndim != 2:
        return f"weight of '{mm.name}' is not a constant 2-D tensor"
    xs = shape_dims(x)
    if xs is None or len(xs) < 2 or explicit_out_dtype(call) not in (None, str(w.const.ty.dtype)):
        return f"'{mm.name}' is not a plain dense projection"
    return None


class _Weight(NamedTuple):
    const: relax.Expr  # a constant
    transposed: bool  # the graph reads it through a [1, 0] transpose (ONNX Gemm transB)


def _weight_of(arg: relax.Expr, graph: FunctionGraph) -> Optional[_Weight]:
    """The constant behind a matmul's weight operand (looking through one transpose), else None."""
    value = graph.value(arg)
    if is_constant(value):
        return _Weight(value, False)
    if op_name(value) == "relax.permute_dims":
        inner = graph.value(value.args[0])
        if is_constant(inner) and inner.ty.ndim == 2 and int_list(value.attrs.axes) in (None, [1, 0]):
            return _Weight(inner, True)
    return None


def _absorb_bias(p: _Projection, graph: FunctionGraph) -> None:
    readers = graph.users(p.matmul)
    if len(readers) != 1 or None in readers:
        return
    (add,) = readers
    value = graph.var2val[add]
    if op_name(value) != "relax.add":
        return
    other = value.args[1] if value.args[0].same_as(p.matmul) else value.args[0]
    b = const_value(graph.value(other))
    n = p.weight.shape[1]
    out_shape = shape_dims(p.matmul)
    if b is None or b.dtype != p.weight.dtype or per_column_bias_error(list(b.shape), n, len(out_shape)):
        return
    if not same_dims(shape_dims(add), out_shape):  # the bias must not broadcast the output
        return
    p.bias, p.add = b.reshape(n), add


class QKVProjectionRule(FusionRule):
    name = "FuseQKVProjection"
    kind = "qkv"

    def variants(self) -> List[Variant]:
        return [Variant(ParallelProjections(), root_op="relax.matmul")]

    def check(self, m: Match) -> Optional[str]:
        group: _Group = m["group"]
        if len(group.projections) < 2:
            return group.refusal
        if len({(p.weight.shape[0], p.weight.dtype) for p in group.projections}) != 1:
            return "projections differ in input width or dtype"
        return None

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> List[relax.Expr]:
        projections: List[_Projection] = m["group"].projections
        w = np.concatenate([p.weight for p in projections], axis=1)
        y = bb.emit(relax.op.matmul(m.arg("x"), relax.const(w)), name_hint="qkv")
        if any(p.bias is not None for p in projections):
            b = np.concatenate([p.bias if p.bias is not None else np.zeros(p.weight.shape[1], p.weight.dtype)
                                for p in projections])
            y = bb.emit(relax.op.add(y, relax.const(b)), name_hint="qkv_bias")
        offsets = np.cumsum(_widths(m))[:-1].tolist()
        split = bb.emit(relax.op.split(y, [int(i) for i in offsets], axis=-1), name_hint="qkv_split")
        return [relax.TupleGetItem(split, i) for i in range(len(projections))]

    def describe(self, m: Match) -> str:
        return f"{len(_widths(m))} projections, widths {_widths(m)}"


def _widths(m: Match) -> List[int]:
    return [p.weight.shape[1] for p in m["group"].projections]


def FuseQKVProjection() -> tvm.transform.Pass:  # noqa: N802  (TVM pass naming)
    """Module pass: parallel constant-weight projections of one input → one matmul + split."""
    return rule_pass("tfx.FuseQKVProjection", [QKVProjectionRule()])
