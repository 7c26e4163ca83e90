"""What the attention rule needs to know about an additive mask: its value when it is built from constants,
whether that value is the causal mask, and an equivalent at the size it varies over.

Exporters build key-padding masks as ``[B, 1, S, T]`` tensors (legacy: ``where(broadcast_to(m), 0, -inf)``
per layer; dynamo: ``logical_and(ones[1,1,S,T], gather_nd(...)[B,1,1,T])`` once). The fused attention operator
broadcasts its mask itself, so the same meaning is carried by the un-broadcast operands: :func:`compact_mask`
peels ``broadcast_to``, shrinks constants along axes where they are uniform, and rebuilds the elementwise ops
on the smaller operands. Anything else is kept as it is.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import numpy as np
import tvm
from tvm import relax

from .graph import FunctionGraph, const_value, op_name, same_dim, shape_dims, static_shape

#: masks at or below this are "minus infinity" for detecting a causal mask: exp(s + m - max) underflows to
#: exactly 0 in any float type, and s + m == m in fp32 for |s| < 1e22, so the op's -inf is the same thing
CAUSAL_NEG = -1e30


def hides_keys(values: np.ndarray) -> bool:
    """Every value is a hidden key's: at or below CAUSAL_NEG, or, in float16 (whose lowest, -65504, is what
    exporters write for -inf there: finfo.min), at its lowest. The operator's softmax runs in float32, where
    exp(s - 65504 - max) is exactly 0 for any score |s| < 65000, so -65504 hides a key as -inf does."""
    limit = float(np.finfo(np.float16).min) if values.dtype == np.float16 else CAUSAL_NEG
    return bool(np.all(values.astype(np.float64) <= limit))

_CONST_EVAL_DEPTH = 8
_COMPACT_DEPTH = 16

_BINARY = {"relax.add": np.add, "relax.multiply": np.multiply, "relax.subtract": np.subtract,
           "relax.logical_and": np.logical_and, "relax.logical_or": np.logical_or}

# ops whose result is the broadcast of their operands, element by element
_ELEMENTWISE = {
    "relax.where", "relax.logical_and", "relax.logical_or", "relax.logical_not", "relax.add", "relax.subtract",
    "relax.multiply", "relax.divide", "relax.negative", "relax.astype", "relax.equal", "relax.not_equal",
    "relax.less", "relax.less_equal", "relax.greater", "relax.greater_equal",
}


# ---------------------------------------------------------------------------------------------------
# value
# ---------------------------------------------------------------------------------------------------

def const_eval(e: relax.Expr, graph: FunctionGraph, depth: int = 0) -> Optional[np.ndarray]:
    """Value of an expression computed from constants only (the masks exporters build), else None."""
    e = graph.value(e)
    value = const_value(e)
    if value is not None:
        return value
    op = op_name(e)
    if depth > _CONST_EVAL_DEPTH or op is None:
        return None

    def arg(i):
        return const_eval(e.args[i], graph, depth + 1)

    if op == "relax.where":
        args = [arg(i) for i in range(3)]
        return None if any(a is None for a in args) else np.where(*args)
    if op == "relax.astype":
        a = arg(0)
        return None if a is None else a.astype(str(e.attrs.dtype))
    if op in ("relax.tril", "relax.triu"):
        a, k = arg(0), e.args[1]
        if a is None or not isinstance(k, tvm.tirx.IntImm):
            return None
        return (np.tril if op == "relax.tril" else np.triu)(a, int(k.value))
    if op in ("relax.reshape", "relax.broadcast_to"):
        a, shape = arg(0), static_shape(e)
        if a is None or shape is None:
            return None
        return a.reshape(shape) if op == "relax.reshape" else np.broadcast_to(a, shape)
    if op == "relax.strided_slice":  # a causal buffer cut to the sequence (OpenAI GPT's dynamo export)
        return _slice_value(e, arg(0))
    if op in _BINARY:
        a, b = arg(0), arg(1)
        if a is None or b is None:
            return None
        with np.errstate(all="ignore"):
            return _BINARY[op](a, b)
    if op == "relax.logical_not":
        a = arg(0)
        return None if a is None else np.logical_not(a)
    return None


def _slice_value(e: relax.Call, a: Optional[np.ndarray]) -> Optional[np.ndarray]:
    """``strided_slice`` of a constant with constant bounds, by numpy's slicing (the same clamping and negative
    indices); None unless the result has the binding's static shape."""
    shape = static_shape(e)
    if a is None or shape is None:
        return None
    bounds = []
    for t in e.args[1:]:
        fields = getattr(t, "fields", None)
        if fields is None or not all(isinstance(f, tvm.tirx.IntImm) for f in fields):
            return None
        bounds.append([int(f) for f in fields])
    axes, begin, end = bounds[:3]
    strides = bounds[3] if len(bounds) > 3 else [1] * len(axes)
    index = [slice(None)] * a.ndim
    for axis, b, n, st in zip(axes, begin, end, strides):
        index[axis % a.ndim] = slice(b, n, st)
    out = a[tuple(index)]
    return out if tuple(out.shape) == tuple(shape) else None


def is_causal_mask(value: np.ndarray, s: int, t: int) -> bool:
    """``value`` (broadcast right-aligned to (…, s, t)) is 0 on visible keys, hides the others (:func:`hides_keys`),
    with the operator's convention: key j is visible to query i iff j <= i + t - s."""
    if value.ndim < 2 or tuple(value.shape[-2:]) != (s, t) or not np.issubdtype(value.dtype, np.floating):
        return False
    hidden = np.arange(t)[None, :] > np.arange(s)[:, None] + (t - s)
    flat = value.reshape(-1, s, t)
    return bool(np.all(flat[:, ~hidden] == 0) and hides_keys(flat[:, hidden]))


def split_causal(mask: relax.Expr, graph: FunctionGraph, s: int, t: int) -> Optional[Tuple[relax.Expr, float]]:
    """``(keep, neg)`` when ``mask`` is ``where(visible ∧ keep, 0, neg)`` (either operand order) with ``visible``
    a constant causal pattern and ``neg`` hiding keys (:func:`hides_keys`): how dynamo exports a decoder's combined causal and
    padding mask, the causal part folded to an S×T constant. The operator then applies the causal part by
    skipping key blocks, and reads only ``keep`` (a key-padding mask, compacted to [B, 1, 1, T]).

    The two agree wherever a query sees at least one key. A row that sees none (a padded query with only padded
    keys before it) gets zero from the operator either way (see ops/attention.py)."""
    value = graph.value(mask)
    if op_name(value) != "relax.where":
        return None
    cond, on, off = (graph.value(a) for a in value.args)
    on_v, off_v = const_eval(on, graph), const_eval(off, graph)
    if on_v is None or off_v is None or on_v.size != 1 or off_v.size != 1:
        return None
    if float(on_v.reshape(())) != 0.0 or not hides_keys(off_v):
        return None
    if op_name(cond) != "relax.logical_and":
        return None
    for visible, keep in (cond.args, reversed(cond.args)):
        pattern = const_eval(visible, graph)
        if pattern is None or pattern.dtype != np.bool_ or const_eval(keep, graph) is not None:
            continue
        if is_causal_mask(np.where(pattern, 0.0, -np.inf), s, t):
            return keep, float(off_v.reshape(()))
    return None


# ---------------------------------------------------------------------------------------------------
# compaction
# ---------------------------------------------------------------------------------------------------

def compact_mask(expr: relax.Expr, graph: FunctionGraph, remap: Callable[[relax.Expr], relax.Expr],
                 bb: relax.BlockBuilder) -> relax.Expr:
    """An expression that broadcasts to ``expr`` (original graph) and is no larger, in the rebuilt graph."""
    small = _compact(expr, graph, remap, bb, depth=0)
    return small if small is not None else remap(expr)


def _smallest_constant(arr: np.ndarray) -> np.ndarray:
    for axis in range(arr.ndim):
        first = np.take(arr, [0], axis=axis)
        if arr.shape[axis] > 1 and np.array_equal(arr, np.broadcast_to(first, arr.shape),
                                                  equal_nan=arr.dtype.kind == "f"):
            arr = first
    while arr.ndim > 0 and arr.shape[0] == 1:
        arr = arr.reshape(arr.shape[1:])
    return arr


def _compact(expr, graph, remap, bb, depth) -> Optional[relax.Expr]:
    """Smaller equivalent of ``expr`` or None when it cannot be made smaller."""
    if depth > _COMPACT_DEPTH:
        return None
    value = graph.value(expr)
    arr = const_value(value)
    if arr is not None:
        small = _smallest_constant(arr)
        return relax.const(small, str(arr.dtype)) if small.size < arr.size else None
    op = op_name(value)
    if op == "relax.broadcast_to":
        inner = value.args[0]
        small = _compact(inner, graph, remap, bb, depth + 1)
        return small if small is not None else remap(inner)
    if op not in _ELEMENTWISE:
        return None
    args, changed = [], False
    for a in value.args:
        small = _compact(a, graph, remap, bb, depth + 1)
        changed |= small is not None
        args.append(small if small is not None else remap(a))
    if not changed:
        return None
    new = bb.normalize(relax.Call(value.op, args, value.attrs, value.ty_args))
    if not _strictly_smaller(shape_dims(new), shape_dims(value)):
        return None
    return bb.emit(new, name_hint="mask")


def _strictly_smaller(new, old) -> bool:
    """``new`` broadcasts to ``old`` (right-aligned, each dim 1 or the same) and has a 1 where ``old`` does not:
    decided per axis, so symbolic dims (``[batch, 1, seq, seq]`` → ``[batch, 1, 1, seq]``) compare too."""
    if new is None or old is None or len(new) > len(old):
        return False
    smaller = len(new) < len(old) and any(not _one(d) for d in old[:len(old) - len(new)])
    for n, o in zip(reversed(new), reversed(old)):
        if _one(n):
            smaller |= not _one(o)
        elif not same_dim(n, o):
            return False
    return smaller


def _one(d) -> bool:
    return isinstance(d, int) and d == 1
