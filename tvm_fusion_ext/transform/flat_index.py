"""Integer index tensors as affine forms of their own coordinates: ``idx[i…] = c + Σ coef_a · i_a``.

Dynamic-shape exports gather the attention mask with ``GatherND`` (``m[b, j]`` read as
``take(reshape(m, [B·S, 1]), b·S + j)``), the flat index built from ``arange``s, the input's shape and
broadcasts. :func:`affine_index` reads such a computation symbolically (coefficients are ``PrimExpr``: ``seq``
stays a variable), so the mask proof can check that the gather is the identity, for every batch and length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import tvm
from tvm import relax, sym

from .graph import FunctionGraph, const_value, op_name, same_dim, shape_dims

_DEPTH = 16


@dataclass
class Affine:
    """``value[i_0, …, i_{n-1}] = const + Σ coef[a] · i_a`` over a tensor of ``ndim`` axes."""

    ndim: int
    coef: Dict[int, tvm.tirx.Expr] = field(default_factory=dict)  # axis counted from the right (-1: last)
    const: tvm.tirx.Expr = 0


def _int(e) -> Optional[int]:
    return int(e.value) if isinstance(e, tvm.tirx.IntImm) else None


def affine_index(e: relax.Expr, graph: FunctionGraph, depth: int = 0) -> Optional[Affine]:
    """The affine form of an integer tensor computation, or None when it is not one this reads."""
    if depth > _DEPTH:
        return None
    v = graph.value(e)
    value = const_value(v)
    if value is not None:
        return _affine_constant(value) if value.dtype.kind in "iu" and value.size else None
    op = op_name(v)

    def arg(i):
        return affine_index(v.args[i], graph, depth + 1)

    if op == "relax.arange":
        start, end, step = (v.args[i] for i in range(3))
        if _int(start) != 0 or _int(step) != 1:
            return None
        return Affine(1, {-1: tvm.tirx.const(1, "int64")}, tvm.tirx.const(0, "int64"))
    if op == "relax.expand_dims":
        a = arg(0)
        if a is None:
            return None
        out_ndim = a.ndim + len(v.attrs.axis)
        new_axes = sorted(int(x) % out_ndim for x in v.attrs.axis)
        kept = [i for i in range(out_ndim) if i not in new_axes]  # where each input axis lands
        coef = {kept[a.ndim + k] - out_ndim: c for k, c in a.coef.items()}
        return Affine(out_ndim, coef, a.const)
    if op in ("relax.add", "relax.multiply"):
        a, b = arg(0), arg(1)
        if a is None or b is None:
            return None
        ndim = max(a.ndim, b.ndim)
        if op == "relax.add":
            coef = dict(a.coef)
            for k, c in b.coef.items():
                coef[k] = coef[k] + c if k in coef else c
            return Affine(ndim, coef, a.const + b.const)
        if a.coef and b.coef:
            return None  # a product of two coordinates is not affine
        scalar, other = (b, a) if not b.coef else (a, b)
        return Affine(ndim, {k: c * scalar.const for k, c in other.coef.items()}, other.const * scalar.const)
    if op == "relax.where" and _never_negative_guard(v, graph, depth):
        # ONNX Gather's negative-index wrap, where(i < 0, i + n, i), on an index that is never negative
        picked = arg(2)
        dims = shape_dims(v)
        return Affine(len(dims), picked.coef, picked.const) if picked is not None and dims is not None else None
    if op == "relax.where":
        cond = graph.value(v.args[0])
        if op_name(cond) == "relax.broadcast_to":  # the exporters' where(broadcast(False), …) guard
            cond = graph.value(cond.args[0])
        cond = const_value(cond)
        if cond is None or cond.dtype != np.bool_ or not (np.all(cond) or not np.any(cond)):
            return None
        picked = arg(1) if bool(cond.reshape(-1)[0]) else arg(2)
        if picked is None:
            return None
        dims = shape_dims(v)
        return Affine(len(dims), picked.coef, picked.const) if dims is not None else None
    if op == "relax.broadcast_to":
        a = arg(0)
        dims = shape_dims(v)
        return None if a is None or dims is None else Affine(len(dims), a.coef, a.const)
    if op == "relax.take":
        # one entry of a shape: take(shape_to_tensor(shape), k)
        src = graph.value(v.args[0])
        k = arg(1)
        if op_name(src) != "relax.shape_to_tensor" or k is None or k.coef or _int(k.const) is None:
            return None
        values = _shape_values(src.args[0], graph)
        return None if values is None else Affine(k.ndim, {}, values[_int(k.const)])
    if op == "relax.shape_to_tensor":
        # a one-entry shape as a tensor, [seq]: uniform, so it broadcasts like a scalar (a shape gathered by
        # constant indices imports this way since 6391bc7)
        values = _shape_values(v.args[0], graph)
        return None if values is None or len(values) != 1 else Affine(1, {}, values[0])
    if op == "relax.astype" and str(v.attrs.dtype) in ("int64", "int32"):
        return arg(0)
    return None


def _shape_values(shape: relax.Expr, graph: FunctionGraph) -> Optional[List]:
    """The entries of a shape value (a literal ``R.shape([...])`` or a variable whose type knows them)."""
    if isinstance(shape, relax.ShapeExpr):
        return list(shape.values)
    if isinstance(shape, relax.Var):
        bound = graph.value(shape)
        if isinstance(bound, relax.ShapeExpr):
            return list(bound.values)
        ty = getattr(shape, "ty", None)
        if isinstance(ty, relax.ShapeType) and getattr(ty, "values", None) is not None:
            return list(ty.values)
    return None


def _affine_constant(value: np.ndarray) -> Optional[Affine]:
    """A constant integer tensor as ``v0 + Σ coef_a · i_a`` (an arange along some axes, or uniform), if it is."""
    zero = (0,) * value.ndim
    coef = {}
    for axis, size in enumerate(value.shape):
        if size > 1:
            step = tuple(1 if a == axis else 0 for a in range(value.ndim))
            coef[axis] = int(value[step]) - int(value[zero])
    grid = np.indices(value.shape) if value.ndim else np.zeros((0,), np.int64)
    rebuilt = int(value[zero]) + sum(c * grid[a] for a, c in coef.items())
    if not np.array_equal(np.broadcast_to(rebuilt, value.shape), value):
        return None
    return Affine(value.ndim, {a - value.ndim: tvm.tirx.const(c, "int64") for a, c in coef.items() if c},
                  tvm.tirx.const(int(value[zero]), "int64"))


def _never_negative_guard(v: relax.Call, graph: FunctionGraph, depth: int) -> bool:
    """``where(less(i, 0), …, i)`` with ``i`` an affine index whose every term is non-negative."""
    cond = graph.value(v.args[0])
    if op_name(cond) != "relax.less" or const_value(graph.value(cond.args[1])) is None:
        return False
    if np.any(const_value(graph.value(cond.args[1])) != 0) or not graph.value(cond.args[0]).same_as(
            graph.value(v.args[2])):
        return False
    index = affine_index(cond.args[0], graph, depth + 1)
    return index is not None and all(_non_negative(c) for c in (*index.coef.values(), index.const))


def _non_negative(e) -> bool:
    """Provably >= 0: non-negative literals and shape variables (sizes), and their sums and products."""
    if isinstance(e, int):
        return e >= 0
    if isinstance(e, tvm.tirx.IntImm):
        return int(e.value) >= 0
    if isinstance(e, tvm.tirx.Var):
        return True  # every symbolic size here is a tensor dimension
    if isinstance(e, (tvm.tirx.Add, tvm.tirx.Mul)):
        return _non_negative(e.a) and _non_negative(e.b)
    if isinstance(e, tvm.tirx.Cast):
        return _non_negative(e.value)
    return False


def is_flat_row_major(idx: Optional[Affine], dims: Optional[List], rows, cols) -> bool:
    """``idx`` over a tensor of shape ``dims`` reads ``b · cols + j``, ``b`` running over an axis of size ``rows``
    and ``j`` over a later one of size ``cols``, every other axis of size 1."""
    if idx is None or dims is None or len(dims) != idx.ndim:
        return False
    b_axis = next((i for i, d in enumerate(dims) if same_dim(d, rows)), None)
    j_axis = next((i for i in reversed(range(len(dims))) if same_dim(dims[i], cols)), None)
    if b_axis is None or j_axis is None or b_axis >= j_axis or any(
            not (isinstance(d, int) and d == 1) for i, d in enumerate(dims) if i not in (b_axis, j_axis)):
        return False
    b_axis, j_axis = b_axis - idx.ndim, j_axis - idx.ndim
    if set(idx.coef) - {b_axis, j_axis}:
        return False
    analyzer = sym.Analyzer()

    def expr(x):
        if isinstance(x, int):
            return tvm.tirx.const(x, "int64")
        return x if str(x.ty) == "int64" else tvm.tirx.Cast("int64", x)

    def equal(x, y):
        return bool(analyzer.can_prove_equal(expr(x), expr(y)))

    single_row = isinstance(rows, int) and rows == 1  # i_b is always 0: its coefficient does not matter
    return ((single_row or equal(idx.coef.get(b_axis, 0), cols)) and equal(idx.coef.get(j_axis, 0), 1)
            and equal(idx.const, 0))
