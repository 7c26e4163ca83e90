"""Symbolic values of the small integer and boolean tensors a graph computes from sizes and positions.

Exporters compute lengths, index tensors and masks at run time from input shapes (``Shape → Gather → Sub →
Range``, ``Range → Unsqueeze → GreaterOrEqual``). :class:`Evaluator` gives such a tensor as a function from its
indices to a TIR expression of the input dims, so a compile-time question about it ("which input dim is this
length?", "is every element of this mask true?") is a question for TVM's arithmetic analyzer. Used by the
ONNX importer (``Range`` with symbolic bounds) and by ``transform.ResolveShapeComputations``.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, sym, tirx
from tvm.ir.expr import Expr as PrimExpr

#: evaluate element-wise only tensors this small when a value is needed per element (shape tensors)
_MAX_ELEMENTS = 16
_INT_BOUND = 2**31 - 1


def op_name(e) -> Optional[str]:
    if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op):
        return str(e.op.name)
    return None

Fn = Callable[[Sequence[PrimExpr]], PrimExpr]


class _Value:
    """A tensor as a function of its indices: ``fn(idx) -> PrimExpr`` over ``shape`` (PrimExprs)."""

    def __init__(self, shape: List[PrimExpr], dtype: str, fn: Fn):
        self.shape, self.dtype, self.fn = shape, dtype, fn


def _i64(v) -> PrimExpr:
    return tirx.IntImm("int64", int(v)) if isinstance(v, (int, np.integer)) else v


class Evaluator:
    """Values of int/bool tensors computed from sizes and positions only.

    ``lookup(var)`` gives the value a variable is bound to (None when unknown); every symbolic dim in
    ``dims`` is at least 1 (and at most its bound)."""

    def __init__(self, lookup: Callable[[relax.Var], Optional[relax.Expr]], dims: Sequence[tirx.Var] = (),
                 bounds: Optional[Dict[str, int]] = None):
        self.lookup = lookup
        self.memo: Dict[relax.Expr, Optional[_Value]] = {}
        self.analyzer = sym.Analyzer()
        for v in dims:
            upper = int(bounds[v.name]) if bounds and v.name in bounds else _INT_BOUND
            self.analyzer.update(v, sym.ConstIntBound(1, upper), override=True)

    @classmethod
    def of_function(cls, func: relax.Function) -> "Evaluator":
        var2val = dict(relax.analysis.get_var2val(func))
        for block in func.body.blocks:  # a match_cast passes its value through (get_var2val leaves them out)
            for b in block.bindings:
                if isinstance(b, relax.MatchCast):
                    var2val[b.var] = b.value
        bounds = func.attrs.get("tir_var_upper_bound") if func.attrs is not None else None
        return cls(var2val.get, relax.analysis.defined_symbolic_vars(func),
                   {str(k): int(v) for k, v in bounds.items()} if bounds is not None else None)

    # -- entry points ---------------------------------------------------------------------------------
    def value(self, expr: relax.Expr) -> Optional[_Value]:
        key = expr
        # 0.27 has one Var class for Relax and TIR: a TIR variable (a size such as ``seq``) is typed PrimType
        if isinstance(expr, relax.Var) and not isinstance(getattr(expr, "ty", None), tvm.ir.PrimType):
            bound = self.lookup(expr)
            if bound is None:
                return None
            expr = bound
        if key not in self.memo:
            self.memo[key] = None  # cycles cannot occur in dataflow, but be safe
            try:
                self.memo[key] = self._eval(expr)
            except (ValueError, TypeError, IndexError, tvm.error.InternalError):
                self.memo[key] = None
        return self.memo[key]

    def elements(self, expr: relax.Expr) -> Optional[List[PrimExpr]]:
        """Every element (row-major) of a small tensor of static shape, simplified; None if unknown."""
        v = self.value(expr)
        if v is None or not all(isinstance(d, tirx.IntImm) for d in v.shape):
            return None
        dims = [int(d) for d in v.shape]
        if int(np.prod(dims)) > _MAX_ELEMENTS:
            return None
        return [self.analyzer.simplify(v.fn([_i64(i) for i in idx])) for idx in np.ndindex(*dims)] if dims \
            else [self.analyzer.simplify(v.fn([]))]

    def uniform(self, expr: relax.Expr) -> Optional[PrimExpr]:
        """The one constant every element of ``expr`` equals, if that is provable."""
        v = self.value(expr)
        if v is None:
            return None
        axes = [tirx.Var(f"i{k}", "int64") for k in range(len(v.shape))]
        with self.analyzer.constraint_scope(tirx.all(*[a < d for a, d in zip(axes, v.shape)],
                                                     *[a >= 0 for a in axes]) if axes else tirx.const(True)):
            out = self.analyzer.simplify(v.fn(axes))
        return out if isinstance(out, (tirx.IntImm, tirx.FloatImm)) else None

    # -- evaluation -------------------------------------------------------------------------------------
    def _eval(self, e: relax.Expr) -> Optional[_Value]:
        ty = getattr(e, "ty", None)
        if isinstance(e, tvm.ir.GenericConst):
            return _const_value(e)
        if isinstance(ty, tvm.ir.PrimType):  # a size passed as a scalar (``Squeeze(Shape(x))`` gives ``seq``)
            return _Value([], str(ty.dtype), lambda idx: e)
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            return None
        dtype = str(ty.dtype)
        if not (dtype.startswith(("int", "uint")) or dtype == "bool"):
            return None
        shape = list(ty.shape.values)
        op = op_name(e)
        if op is None:
            return None
        args = e.args
        if op == "relax.shape_to_tensor":
            dims = _shape_values(args[0])
            if not dims:  # unknown, or the empty shape of a scalar (no element to select)
                return None
            return _Value(shape, dtype, lambda idx: _select(dims, idx[0]))
        if op == "relax.arange":
            start, _, step = (_prim(a) for a in args[:3])
            if start is None or step is None:
                return None
            return _Value(shape, dtype, lambda idx: tirx.Cast(dtype, start + idx[0] * step))
        if op == "relax.astype":
            src = self.value(args[0])
            if src is None:
                return None
            return _Value(shape, dtype, lambda idx: _cast(dtype, src.fn(idx)))
        if op in ("relax.expand_dims", "relax.reshape", "relax.squeeze", "relax.broadcast_to", "relax.permute_dims"):
            return self._layout(op, e, shape, dtype)
        if op == "relax.take":
            return self._take(e, shape, dtype)
        if op == "relax.strided_slice":
            return self._slice(e, shape, dtype)
        if op == "relax.concat":
            return self._concat(e, shape, dtype)
        combine = self._division(op) if op in ("relax.divide", "relax.mod") else _ELEMENTWISE.get(op)
        if combine is not None:
            vals = [self.value(a) for a in args]
            if any(v is None for v in vals):
                return None
            return _Value(shape, dtype, lambda idx: combine(*[_broadcast_at(v, idx) for v in vals]))
        return None

    @staticmethod
    def _division(op):
        """Integer ``Div``/``Mod`` (truncating in ONNX) in floor form where they are divisions of sizes (see
        :func:`size_floor_division`)."""
        floor, trunc = (tirx.floordiv, tirx.truncdiv) if op == "relax.divide" else (tirx.floormod, tirx.truncmod)
        return lambda a, b: floor(a, b) if is_size_division(a, b) else trunc(a, b)

    def _layout(self, op, e, shape, dtype) -> Optional[_Value]:
        src = self.value(e.args[0])
        if src is None:
            return None
        if op == "relax.permute_dims":
            axes = e.attrs.axes
            axes = list(reversed(range(len(shape)))) if axes is None else [int(a) % len(shape) for a in axes]
            inverse = [axes.index(k) for k in range(len(axes))]
            return _Value(shape, dtype, lambda idx: src.fn([idx[inverse[k]] for k in range(len(axes))]))
        if op == "relax.broadcast_to":
            return _Value(shape, dtype, lambda idx: _broadcast_at(src, idx))
        # expand_dims / squeeze / reshape: only unit axes may come and go (the non-unit axes keep their order)
        keep_src = [k for k, d in enumerate(src.shape) if not _is_one(d)]
        keep_dst = [k for k, d in enumerate(shape) if not _is_one(d)]
        if len(keep_src) != len(keep_dst) or not all(
                tvm_ffi.structural_equal(src.shape[a], shape[b]) or self.analyzer.can_prove_equal(src.shape[a], shape[b])
                for a, b in zip(keep_src, keep_dst)):
            return _row_major_reshape(src, shape, dtype) if op == "relax.reshape" else None

        def fn(idx):
            full = [_i64(0)] * len(src.shape)
            for a, b in zip(keep_src, keep_dst):
                full[a] = idx[b]
            return src.fn(full)

        return _Value(shape, dtype, fn)

    def _slice(self, e, shape, dtype) -> Optional[_Value]:
        """``strided_slice`` with constant begins and strides (``Shape(x)[k:k+1]``, a negative index's extent)."""
        src = self.value(e.args[0])
        if src is None:
            return None
        fields = [[f.value if isinstance(f, tirx.IntImm) else None for f in t.fields] for t in e.args[1:3]]
        strides = [f.value if isinstance(f, tirx.IntImm) else None for f in e.args[4].fields] \
            if len(e.args) > 4 else [1] * len(fields[0])
        axes, begins = fields
        if None in axes or None in begins or None in strides:
            return None
        start = {}
        for a, b, st in zip(axes, begins, strides):
            a %= len(src.shape)
            extent = src.shape[a]
            if not isinstance(extent, tirx.IntImm) or st == 0:
                return None  # a symbolic extent: not needed by what exporters compute
            b = b + int(extent) if b < 0 else b
            # a reverse slice (``F.pad``'s pads flipped by a legacy export) starts at most at the last element
            start[a] = (min(max(b, 0), int(extent)) if st > 0 else min(max(b, -1), int(extent) - 1), st)

        def fn(idx):
            return src.fn([idx[k] * start[k][1] + start[k][0] if k in start else idx[k] for k in range(len(idx))])

        return _Value(shape, dtype, fn)

    def _concat(self, e, shape, dtype) -> Optional[_Value]:
        """``concat`` of parts whose extents along the axis are static (a shape built from sizes and zeros)."""
        parts = e.args[0]
        if isinstance(parts, relax.Var):
            parts = self.lookup(parts)
        if not isinstance(parts, relax.Tuple):
            return None
        vals = [self.value(p) for p in parts.fields]
        if not vals or any(v is None for v in vals):
            return None
        axis = int(e.attrs.axis) % len(shape)
        if not all(isinstance(v.shape[axis], tirx.IntImm) for v in vals):
            return None
        offsets = list(np.cumsum([0] + [int(v.shape[axis]) for v in vals]))

        def part_at(idx, k):
            return vals[k].fn([*idx[:axis], idx[axis] - _i64(offsets[k]), *idx[axis + 1:]])

        def fn(idx):
            at = idx[axis]
            if isinstance(at, tirx.IntImm):
                k = int(np.searchsorted(offsets, int(at), side="right")) - 1
                return part_at(idx, k)
            out = part_at(idx, len(vals) - 1)
            for k in range(len(vals) - 2, -1, -1):
                out = tirx.Select(at < _i64(offsets[k + 1]), part_at(idx, k), out)
            return out

        return _Value(shape, dtype, fn)

    def _take(self, e, shape, dtype) -> Optional[_Value]:
        data, index = self.value(e.args[0]), self.value(e.args[1])
        if data is None or index is None:
            return None
        axis = int(e.attrs.axis) if e.attrs.axis is not None else 0
        axis %= len(data.shape)
        n_idx = len(index.shape)

        def fn(idx):
            at = index.fn(idx[axis: axis + n_idx])
            return data.fn([*idx[:axis], tirx.Cast("int64", at), *idx[axis + n_idx:]])

        return _Value(shape, dtype, fn)


def is_size_division(a: PrimExpr, b: PrimExpr) -> bool:
    """Whether ``a / b`` divides a size (every variable in ``a`` a dim, at least 0, and ``a >= 0`` then) by a positive
    number: truncating and floor division agree there, and TVM's analyzer reasons about the floor form only, so a
    length computed as ``Div(seq, 10) - 1`` (wav2vec2's dynamo export, building a Reshape target) is then provably
    the ``seq // 10 - 1`` of the conv output it reshapes."""
    ana = sym.Analyzer()
    for var in list(tirx.analysis.undefined_vars(a)) + list(tirx.analysis.undefined_vars(b)):
        ana.update(var, sym.ConstIntBound(0, 2**62), override=True)
    return bool(ana.can_prove(a >= 0) and ana.can_prove(b > 0))


def _row_major_reshape(src: _Value, shape, dtype) -> Optional[_Value]:
    """A reshape between static shapes: the element at a flat row-major position stays at that position."""
    if not all(isinstance(d, tirx.IntImm) for d in (*src.shape, *shape)):
        return None
    src_dims, dst_dims = [int(d) for d in src.shape], [int(d) for d in shape]
    if int(np.prod(src_dims)) != int(np.prod(dst_dims)):
        return None
    dst_strides = [int(np.prod(dst_dims[k + 1:])) for k in range(len(dst_dims))]

    def fn(idx):
        flat = sum((i * _i64(st) for i, st in zip(idx, dst_strides)), _i64(0))
        out = []
        for k in range(len(src_dims) - 1, -1, -1):
            out.append(tirx.floormod(flat, _i64(src_dims[k])))
            flat = tirx.floordiv(flat, _i64(src_dims[k]))
        return src.fn(out[::-1])

    return _Value(list(shape), dtype, fn)


def _const_value(c) -> Optional[_Value]:
    arr = c.value.numpy()
    dtype = str(arr.dtype)
    if not (dtype.startswith(("int", "uint")) or dtype == "bool"):
        return None
    shape = [_i64(d) for d in arr.shape]
    flat = arr.reshape(-1)
    if not flat.size:  # an empty slice of a shape (``Shape(x)[3:]`` of a 3-D x), concatenated to one
        return _Value(shape, dtype, lambda idx: tirx.const(0, dtype))
    if flat.size and (flat == flat[0]).all():
        value = tirx.const(bool(flat[0]) if dtype == "bool" else int(flat[0]), dtype)
        return _Value(shape, dtype, lambda idx: value)
    if arr.ndim == 1 and 0 < arr.size <= _MAX_ELEMENTS:
        values = [tirx.const(bool(x) if dtype == "bool" else int(x), dtype) for x in flat]
        return _Value(shape, dtype, lambda idx: _select(values, idx[0]))
    return None


def _shape_values(e) -> Optional[List[PrimExpr]]:
    if isinstance(e, relax.ShapeExpr):
        return list(e.values)
    ty = getattr(e, "ty", None)
    if isinstance(ty, relax.ShapeType) and ty.values is not None:
        return list(ty.values)
    return None


def _prim(e) -> Optional[PrimExpr]:
    """A scalar argument (0.27 passes PrimExprs directly where older TVM wrapped them in PrimValue)."""
    return e if isinstance(getattr(e, "ty", None), tvm.ir.PrimType) else None


def _select(values: Sequence[PrimExpr], i: PrimExpr) -> PrimExpr:
    if isinstance(i, tirx.IntImm):
        return values[int(i)]
    out = values[-1]
    for k in range(len(values) - 2, -1, -1):
        out = tirx.Select(i == k, values[k], out)
    return out


def _cast(dtype: str, v: PrimExpr) -> PrimExpr:
    if dtype == "bool":
        return v != tirx.const(0, str(v.ty)) if str(v.ty) != "bool" else v
    return tirx.Cast(dtype, v)


def _is_one(d) -> bool:
    return isinstance(d, tirx.IntImm) and int(d) == 1


def _broadcast_at(v: _Value, idx: Sequence[PrimExpr]) -> PrimExpr:
    """``v`` read at output index ``idx`` under right-aligned broadcasting."""
    offset = len(idx) - len(v.shape)
    return v.fn([_i64(0) if _is_one(d) else idx[offset + k] for k, d in enumerate(v.shape)])


def _as_int(x):
    return tirx.Cast("int64", x) if str(x.ty) == "bool" else x


_ELEMENTWISE = {
    "relax.add": lambda a, b: a + b,
    "relax.subtract": lambda a, b: a - b,
    "relax.multiply": lambda a, b: a * b,
    "relax.floor_divide": lambda a, b: tirx.floordiv(a, b),
    "relax.floor_mod": lambda a, b: tirx.floormod(a, b),  # ONNX Mod (fmod=0) of integers
    "relax.mod": lambda a, b: tirx.truncmod(a, b),  # ONNX Mod with fmod=1
    # relax.divide of integers lowers to TIR's truncating division (ONNX Div of int64 sizes: torch.chunk)
    "relax.divide": lambda a, b: tirx.truncdiv(a, b),
    "relax.negative": lambda a: -a,
    "relax.maximum": lambda a, b: tirx.max(a, b),
    "relax.minimum": lambda a, b: tirx.min(a, b),
    "relax.equal": lambda a, b: a == b,
    "relax.not_equal": lambda a, b: a != b,
    "relax.less": lambda a, b: a < b,
    "relax.less_equal": lambda a, b: a <= b,
    "relax.greater": lambda a, b: a > b,
    "relax.greater_equal": lambda a, b: a >= b,
    "relax.logical_and": lambda a, b: tirx.all(a, b),
    "relax.logical_or": lambda a, b: tirx.any(a, b),
    "relax.logical_not": lambda a: tirx.Not(a),
    "relax.where": lambda c, a, b: tirx.Select(c, a, b),
}
