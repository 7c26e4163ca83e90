"""Compute an attention mask at the size it varies over, not at the S×T size exporters broadcast it to.

Exporters build key-padding masks as ``[B, 1, S, T]`` tensors (legacy: ``where(broadcast_to(m), 0, -inf)``
per layer; dynamo: ``logical_and(ones[1,1,S,T], gather_nd(...)[B,1,1,T])`` once). The fused attention operator
broadcasts its mask itself, so the same meaning is carried by the un-broadcast operands: peel
``broadcast_to``, shrink constants along axes where they are uniform, and rebuild the elementwise ops on the
smaller operands. Anything else is kept as it is.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from tvm import relax

from .rule import const_value, static_shape

# ops whose result is the broadcast of their operands, element by element
_ELEMENTWISE = {
    "relax.where", "relax.logical_and", "relax.logical_or", "relax.logical_not", "relax.add", "relax.subtract",
    "relax.multiply", "relax.divide", "relax.negative", "relax.astype", "relax.equal", "relax.not_equal",
    "relax.less", "relax.less_equal", "relax.greater", "relax.greater_equal",
}


def _smallest_constant(arr: np.ndarray) -> np.ndarray:
    for axis in range(arr.ndim):
        first = np.take(arr, [0], axis=axis)
        if arr.shape[axis] > 1 and np.array_equal(arr, np.broadcast_to(first, arr.shape), equal_nan=arr.dtype.kind == "f"):
            arr = first
    while arr.ndim > 0 and arr.shape[0] == 1:
        arr = arr.reshape(arr.shape[1:])
    return arr


def compact_mask(expr: relax.Expr, var2val: dict, remap: Callable[[relax.Expr], relax.Expr],
                 bb: relax.BlockBuilder) -> relax.Expr:
    """An expression that broadcasts to ``expr`` (original graph) and is no larger, in the rebuilt graph."""
    small = _compact(expr, var2val, remap, bb, depth=0)
    return small if small is not None else remap(expr)


def _numel(e) -> Optional[int]:
    shape = static_shape(e)
    return None if shape is None else int(np.prod(shape)) if shape else 1


def _compact(expr, var2val, remap, bb, depth) -> Optional[relax.Expr]:
    """Smaller equivalent of ``expr`` or None when it cannot be made smaller."""
    if depth > 16:
        return None
    value = var2val.get(expr, expr) if isinstance(expr, relax.Var) else expr
    arr = const_value(value)
    if arr is not None:
        small = _smallest_constant(arr)
        return relax.const(small, str(arr.dtype)) if small.size < arr.size else None
    if not isinstance(value, relax.Call) or not hasattr(value.op, "name"):
        return None
    op = str(value.op.name)
    if op == "relax.broadcast_to":
        inner = value.args[0]
        small = _compact(inner, var2val, remap, bb, depth + 1)
        return small if small is not None else remap(inner)
    if op not in _ELEMENTWISE:
        return None
    args, changed = [], False
    for a in value.args:
        small = _compact(a, var2val, remap, bb, depth + 1)
        changed |= small is not None
        args.append(small if small is not None else remap(a))
    if not changed:
        return None
    new = bb.normalize(relax.Call(value.op, args, value.attrs, value.ty_args))
    if _numel(new) is None or _numel(new) >= _numel(value):
        return None
    return bb.emit(new, name_hint="mask")
