"""ResolveShapeComputations: what an exporter computes at run time from input *sizes*, known at compile time.

Pattern
    Integer and boolean tensors built from sizes and positions only: ``shape_to_tensor``/``shape_of``, ``arange``,
    constants, index arithmetic, comparisons, casts, reshapes/broadcasts (dynamic-axis exports compute lengths with
    ``Shape → Gather → Sub/Div/Max → Range`` chains and masks with ``Range → Unsqueeze → GreaterOrEqual``), and the
    ``match_cast`` bindings through which TVM's importer gives each data-dependent length a fresh variable
    (``range_len_0``), unrelated to the input dim it equals.
Check
    Each element of such a tensor is evaluated as a TIR expression of the input dims and of its own position
    (``i`` ranging over the axis), and simplified knowing every dim is at least 1 and every position in range.
    A fresh variable is bound only where its value is proved; a tensor is folded only where every element
    simplifies to the same constant.
Rewrite
    Each fresh variable is replaced by the expression it equals (``range_len_0`` → ``batch``), so shapes agree
    across the graph (``[batch, 1, 1, seq]``, not ``[range_len_0, 1, 1, range_len_0_2]``); a tensor proved uniform
    becomes its constant broadcast to its shape (a ``[1, 1, seq, 1]`` all-true mask becomes ``broadcast_to(True)``,
    which mask compaction then shrinks). Static models pass through unchanged: their shape computations are
    constants already.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, sym, tirx
from tvm.ir.expr import Expr as PrimExpr

from .graph import op_name

#: evaluate element-wise only tensors this small when a value is needed per element (shape tensors)
_MAX_ELEMENTS = 16
_INT_BOUND = 2**31 - 1

Fn = Callable[[Sequence[PrimExpr]], PrimExpr]


class _Value:
    """A tensor as a function of its indices: ``fn(idx) -> PrimExpr`` over ``shape`` (PrimExprs)."""

    def __init__(self, shape: List[PrimExpr], dtype: str, fn: Fn):
        self.shape, self.dtype, self.fn = shape, dtype, fn


def _i64(v) -> PrimExpr:
    return tirx.IntImm("int64", int(v)) if isinstance(v, (int, np.integer)) else v


class _Evaluator:
    """Values of the int/bool tensors of one function that are computed from sizes and positions only."""

    def __init__(self, func: relax.Function):
        self.var2val = dict(relax.analysis.get_var2val(func))
        for block in func.body.blocks:  # a match_cast passes its value through (get_var2val leaves them out)
            for b in block.bindings:
                if isinstance(b, relax.MatchCast):
                    self.var2val[b.var] = b.value
        self.memo: Dict[relax.Expr, Optional[_Value]] = {}
        self.analyzer = sym.Analyzer()
        bounds = func.attrs.get("tir_var_upper_bound") if func.attrs is not None else None
        for v in relax.analysis.defined_symbolic_vars(func):
            upper = int(bounds[v.name]) if bounds is not None and v.name in bounds else _INT_BOUND
            self.analyzer.update(v, sym.ConstIntBound(1, upper), override=True)

    # -- entry points ---------------------------------------------------------------------------------
    def value(self, expr: relax.Expr) -> Optional[_Value]:
        if isinstance(expr, relax.Var) and expr in self.var2val:
            key = expr
            expr = self.var2val[expr]
        else:
            key = expr
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
        combine = _ELEMENTWISE.get(op)
        if combine is not None:
            vals = [self.value(a) for a in args]
            if any(v is None for v in vals):
                return None
            return _Value(shape, dtype, lambda idx: combine(*[_broadcast_at(v, idx) for v in vals]))
        return None

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
            return None

        def fn(idx):
            full = [_i64(0)] * len(src.shape)
            for a, b in zip(keep_src, keep_dst):
                full[a] = idx[b]
            return src.fn(full)

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


def _const_value(c) -> Optional[_Value]:
    arr = c.value.numpy()
    dtype = str(arr.dtype)
    if not (dtype.startswith(("int", "uint")) or dtype == "bool"):
        return None
    shape = [_i64(d) for d in arr.shape]
    flat = arr.reshape(-1)
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


# ---------------------------------------------------------------------------------------------------------
# the pass
# ---------------------------------------------------------------------------------------------------------

def _fresh_var_bindings(func: relax.Function, ev: _Evaluator) -> Dict[tirx.Var, PrimExpr]:
    """``match_cast`` variables whose value is proved: ``v: R.Shape([n]) = match_cast(tensor_to_shape(t), …)``."""
    subs: Dict[tirx.Var, PrimExpr] = {}
    inputs = {v for p in func.params if isinstance(p.ty, relax.TensorType) and p.ty.shape is not None
              for d in p.ty.shape.values for v in tirx.analysis.undefined_vars(d)}
    for block in func.body.blocks:
        for b in block.bindings:
            if not isinstance(b, relax.MatchCast):
                continue
            pattern = b.ty
            if not isinstance(pattern, relax.ShapeType) or pattern.values is None:
                continue
            source = b.value
            while isinstance(source, relax.Var) and source in ev.var2val:
                source = ev.var2val[source]
            if op_name(source) != "relax.tensor_to_shape":
                continue
            elements = ev.elements(source.args[0])
            if elements is None or len(elements) != len(pattern.values):
                continue
            for target, value in zip(pattern.values, elements):
                if isinstance(target, tirx.Var) and target not in inputs and target not in subs \
                        and not _uses(value, target):
                    subs[target] = value
    return subs


def _uses(expr: PrimExpr, var: tirx.Var) -> bool:
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))


@relax.expr_functor.mutator
class _FoldUniform(relax.PyExprMutator):
    def __init__(self, mod, ev: _Evaluator):
        super().__init__(mod)
        self.ev = ev
        self.folded = 0

    def visit_var_binding_(self, binding):
        value = binding.value
        ty = binding.var.ty
        if (isinstance(value, relax.Call) and isinstance(ty, relax.TensorType) and ty.shape is not None
                and op_name(value) not in ("relax.broadcast_to", None)
                and not isinstance(value, tvm.ir.GenericConst)):
            c = self.ev.uniform(binding.var)
            if c is not None:
                dtype = str(ty.dtype)
                scalar = relax.const(bool(c.value) if dtype == "bool" else c.value, dtype)
                new = relax.op.broadcast_to(scalar, ty.shape) if len(ty.shape.values) else scalar
                self.folded += 1
                self.set_var_remap(binding.var, self.builder_.emit(new, name_hint=binding.var.name))
                return
        super().visit_var_binding_(binding)


def _resolve(mod: tvm.IRModule) -> tvm.IRModule:
    out = None
    for gv, func in list(mod.functions_items()):
        if not isinstance(func, relax.Function) or func.attrs is not None and "Primitive" in func.attrs:
            continue
        changed = False
        for _ in range(4):  # a bound variable can make another length provable
            subs = _fresh_var_bindings(func, _Evaluator(func))
            if not subs:
                break
            func = func.bind_symbolic_vars(subs)
            changed = True
        ev = _Evaluator(func)
        target = out if out is not None else mod.clone()
        folder = _FoldUniform(target, ev)
        new_func = folder.visit_expr(func)
        if folder.folded:
            func, changed = relax.analysis.remove_all_unused(new_func), True
        if changed:
            out = target
            out[gv] = func
    if out is None:
        return mod
    return relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(out))


def ResolveShapeComputations() -> tvm.transform.Pass:  # noqa: N802  (TVM pass naming)
    """Module pass: size computations bound to the input dims they equal; uniform index/mask tensors folded."""
    return tvm.transform.module_pass(lambda mod, _ctx: _resolve(mod), opt_level=0,
                                     name="tfx.ResolveShapeComputations")
