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

from typing import Dict

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.ir.expr import Expr as PrimExpr

from ..frontend.symbolic_values import Evaluator
from .graph import op_name

# ---------------------------------------------------------------------------------------------------------
# the pass
# ---------------------------------------------------------------------------------------------------------

def _fresh_var_bindings(func: relax.Function, ev: Evaluator) -> Dict[tirx.Var, PrimExpr]:
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
            while isinstance(source, relax.Var) and ev.lookup(source) is not None:
                source = ev.lookup(source)
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
    def __init__(self, mod, ev: Evaluator):
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


@relax.expr_functor.mutator
class _SimplifyShapes(relax.PyExprMutator):
    """Shape expressions the importer left unsimplified, simplified: BLOOM's legacy export divides a size back
    (``batch · heads // heads``) and the importer writes ``T.Div(batch * 4, 4)`` as a dim. A kernel taking a
    buffer of that dim cannot bind ``batch`` from it (only a bare variable dim defines one), so its loops over
    ``batch`` fail to build; simplified, the dim is ``batch`` itself and agrees with every other tensor's."""

    def __init__(self, mod, analyzer):
        super().__init__(mod)
        self.analyzer = analyzer
        self.simplified = 0

    def visit_shape_expr_(self, op):
        values = [self.analyzer.simplify(v) for v in op.values]
        if all(tvm_ffi.structural_equal(a, b) for a, b in zip(values, op.values)):
            return op
        self.simplified += 1
        return relax.ShapeExpr(values)


def _simplify_shapes(mod: tvm.IRModule, func: relax.Function):
    """``func`` with its shape expressions simplified, or None when none changes."""
    from tvm import sym

    mutator = _SimplifyShapes(mod, sym.Analyzer())
    new_func = mutator.visit_expr(func)
    return new_func if mutator.simplified else None


def _resolve(mod: tvm.IRModule) -> tvm.IRModule:
    out = None
    for gv, func in list(mod.functions_items()):
        if not isinstance(func, relax.Function) or func.attrs is not None and "Primitive" in func.attrs:
            continue
        changed = False
        for _ in range(4):  # a bound variable can make another length provable
            subs = _fresh_var_bindings(func, Evaluator.of_function(func))
            if not subs:
                break
            func = func.bind_symbolic_vars(subs)
            changed = True
        target = out if out is not None else mod.clone()
        simpler = _simplify_shapes(target, func)
        if simpler is not None:
            func, changed = simpler, True
        ev = Evaluator.of_function(func)
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
