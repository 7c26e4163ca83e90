"""A chain of ``permute_dims`` / ``reshape`` that moves no element → one ``reshape`` (or ``permute_dims``).

Layout changes meet in pairs that cancel. ViT's patch embedding, as :mod:`.conv_matmul` writes it, ends in
``[N, P, O] → permute → [N, O, P] → reshape → [N, O, h, w]``, and the model then flattens and transposes back to
``[N, P, O]``; ConvNeXt permutes to channels-last around each LayerNorm and back. TVM keeps every permute as a
copy (and a fused elementwise kernel that reads through one strides across memory). What a chain of layout ops
does is decidable on its shapes alone: apply it to ``arange`` of the source's size and compare.

Pattern
    ``permute_dims`` or ``reshape`` at the end of a chain of ``permute_dims`` / ``reshape`` bindings, each
    intermediate read by the next one only, at least one of them a ``permute_dims``.
Check (in the matcher: a chain that moves data is what it says, not a near miss)
    known shapes, at most :data:`MAX_ELEMENTS` elements; the chain is the identity, a ``reshape`` of its source,
    or a single ``permute_dims`` of it. Symbolic dims (a dynamic batch and length) are decided at two trials, each
    giving every variable a distinct prime size (:func:`at_size`), which must give the same plan.
Rewrite
    the source, ``reshape(source, shape)``, or ``permute_dims(source, axes)``.
"""

from __future__ import annotations

import functools
from typing import List, Optional

import numpy as np
import tvm
from tvm import relax

from ..graph import FunctionGraph, op_name, same_dims, shape_dims
from ..rule import Found, FusionRule, Match, Matcher, Variant

LAYOUT_OPS = ("relax.permute_dims", "relax.reshape")
#: the arange the check runs the chain on, at most this many elements
MAX_ELEMENTS = 1 << 24


def _axes(call: relax.Call, rank: int) -> List[int]:
    axes = call.attrs.axes
    return list(range(rank))[::-1] if axes is None else [int(a) for a in axes]


def apply_layout_chain(chain: List[relax.Call], source: np.ndarray, shapes: List[List[int]]) -> np.ndarray:
    """``source`` (an array) through the chain's permutes and reshapes (``shapes``: each op's output shape)."""
    a = source
    for call, shape in zip(chain, shapes):
        if op_name(call) == "relax.permute_dims":
            a = a.transpose(_axes(call, a.ndim))
        else:
            a = a.reshape(shape)
    return a


def _single_permutation(source: np.ndarray, result: np.ndarray) -> Optional[List[int]]:
    if source.ndim != result.ndim:
        return None
    # the axis of the source each result axis walks: where one step along it lands
    strides = [s // source.itemsize for s in source.strides]
    flat = source.reshape(-1)
    axes = []
    for axis in range(result.ndim):
        if result.shape[axis] == 1:
            axes.append(None)
            continue
        idx = [0] * result.ndim
        idx[axis] = 1
        step = int(result[tuple(idx)] - flat[0])
        if step not in strides:
            return None
        axes.append(strides.index(step))
    free = [a for a in range(source.ndim) if a not in axes]
    axes = [free.pop(0) if a is None else a for a in axes]
    if sorted(axes) != list(range(source.ndim)) or not np.array_equal(source.transpose(axes), result):
        return None
    return axes


def _static_plan(source_shape, chain, shapes):
    if source_shape is None or any(sh is None for sh in shapes) or int(np.prod(source_shape)) > MAX_ELEMENTS:
        return None
    ops = tuple(("permute", _axes_attr(call)) if op_name(call) == "relax.permute_dims" else ("reshape",)
                for call in chain)
    plan = _plan_of_shapes(tuple(int(d) for d in source_shape), ops, tuple(tuple(int(d) for d in sh)
                                                                           for sh in shapes))
    return None if plan is None else (plan[0], list(plan[1]))


def _axes_attr(call: relax.Call):
    axes = call.attrs.axes
    return None if axes is None else tuple(int(a) for a in axes)


@functools.lru_cache(maxsize=256)
def _plan_of_shapes(source_shape, ops, shapes):
    """:func:`_static_plan` on its shapes alone (a chain's effect depends on nothing else): every layer of a model
    repeats the same chains at the same sizes, and each check runs on an arange of up to :data:`MAX_ELEMENTS`
    elements (a decoder's [batch, length, hidden] at the trial sizes is ten million), so each is decided once."""
    # int32 holds every index below MAX_ELEMENTS: half the memory traffic of int64, the same comparisons
    source = np.arange(int(np.prod(source_shape)), dtype=np.int32).reshape(source_shape)
    a = source
    try:
        for op, shape in zip(ops, shapes):
            a = a.transpose(list(range(a.ndim))[::-1] if op[1] is None else list(op[1])) if op[0] == "permute" \
                else a.reshape(shape)
    except ValueError:  # sizes that do not hold at these trial sizes (an export with a traced length baked in)
        return None
    if np.array_equal(a.reshape(-1), source.reshape(-1)):
        return ("reshape", tuple(a.shape))
    axes = _single_permutation(source, a)
    return None if axes is None else ("permute", tuple(axes))


#: the trials a chain with symbolic dims is decided at (each gives every variable a size of its own, see at_size)
TRIALS = (0, 1)
#: sizes the variables take: distinct primes, so that no two variables coincide, and large, so that a dim computed
#: from one (``seq // 10``) is not 1 or 0: a unit or empty axis moves nowhere, and two variables of one size hide
#: what a chain does with them (wav2vec2's dynamic export, ``[B, 4, seq // 10, 16] -> [B, 4, 16, seq // 10] ->
#: [B, 64, seq // 10]``, was taken for a reshape at sizes where ``seq // 10`` was 1, and computed wrong)
_PRIMES = (101, 103, 107, 109, 113, 127, 131, 137, 139, 149, 151, 157)


def at_size(dims_list, trial: int):
    """Each shape of ``dims_list`` (ints and symbolic expressions) with every symbolic variable set to a size of its
    own for ``trial`` (0 or 1: the sizes differ between trials too); None for a shape that does not evaluate to
    integers, or when there are more variables than sizes."""
    from tvm import sym

    variables = {}
    for dims in dims_list:
        for d in dims or ():
            if not isinstance(d, int):
                for v in tvm.tirx.analysis.undefined_vars(d):
                    variables.setdefault(v.name, v)
    names = sorted(variables)
    if 2 * len(names) > len(_PRIMES):
        return [None] * len(dims_list)
    analyzer = sym.Analyzer()
    for i, name in enumerate(names):
        v = variables[name]
        analyzer.bind(v, tvm.tirx.IntImm(str(v.ty.dtype), _PRIMES[2 * i + trial]))
    out = []
    for dims in dims_list:
        if dims is None:
            out.append(None)
            continue
        values = [d if isinstance(d, int) else analyzer.simplify(d) for d in dims]
        out.append([int(v) if isinstance(v, (int, tvm.tirx.IntImm)) else None for v in values])
        symbolic = [v for d, v in zip(dims, out[-1]) if not isinstance(d, int)]
        if None in out[-1] or any(v < 2 for v in symbolic):
            out[-1] = None
    return out


def _plan(source_dims, chain, link_dims):
    """``("reshape", dims)`` or ``("permute", axes)`` for a chain that is one of them, else None."""
    if source_dims is None or any(d is None for d in link_dims):
        return None
    if all(isinstance(d, int) for d in source_dims) and all(isinstance(d, int) for ds in link_dims for d in ds):
        return _static_plan(source_dims, chain, link_dims)
    plans = []
    for trial in TRIALS:
        source, *links = at_size([source_dims, *link_dims], trial)
        plans.append(_static_plan(source, chain, links))
    if plans[0] is None or plans[0][0] != plans[1][0]:
        return None
    if plans[0][0] == "permute":
        return plans[0] if plans[0] == plans[1] else None
    return ("reshape", list(link_dims[-1]))  # the chain's own result shape, symbolic dims and all


class _ChainMatcher(Matcher):
    def match(self, root: relax.Var, graph: FunctionGraph) -> Optional[Found]:
        value = graph.var2val[root]
        if op_name(value) not in LAYOUT_OPS:
            return None
        chain, links, aliases, user = [value], [root], [], root
        e = value.args[0]
        # walk up while the previous layout op is read by this chain alone (through aliases a rewrite left)
        while isinstance(e, relax.Var) and graph.users(e) == {user} and len(chain) < 8:
            bound = graph.var2val.get(e)
            if isinstance(bound, relax.Var):
                aliases.append(e)
                user, e = e, bound
                continue
            if op_name(bound) not in LAYOUT_OPS:
                break
            user = e
            links.append(e)
            chain.append(bound)
            e = bound.args[0]
        if len(chain) < 2 or not any(op_name(c) == "relax.permute_dims" for c in chain):
            return None
        chain, links = chain[::-1], links[::-1]
        plan = _plan(shape_dims(e), chain, [shape_dims(v) for v in links])
        if plan is None:
            return None
        return Found({"source": e, "plan": plan}, covered=links[:-1] + aliases)


class LayoutChainAsReshape(FusionRule):
    name = "LayoutChainAsReshape"
    kind = "canonical"

    def variants(self) -> List[Variant]:
        return [Variant(_ChainMatcher(), root_op=op) for op in LAYOUT_OPS]

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        kind, arg = m["plan"]
        source = m.arg("source")
        if kind == "reshape":
            return source if same_dims(shape_dims(m["source"]), arg) else relax.op.reshape(source, arg)
        return relax.op.permute_dims(source, arg)
