"""What the Relax passes over fused-operator calls read from a ``call_tir``: the operator, its inputs by name, and
the constants bound to them (a weight to pack, to convert to bf16 or to quantize)."""

from __future__ import annotations

from typing import Optional, Tuple

import tvm
from tvm import relax

from ...ops.registry import op_of, inputs_of


def operator_call(mod: tvm.IRModule, call: relax.Call) -> Optional[Tuple[str, tvm.tirx.PrimFunc, dict]]:
    """``(operator, PrimFunc, {input name: argument})`` of a ``call_tir`` of one of our operators, else None."""
    if call.op != tvm.ir.Op.get("relax.call_tir") or not isinstance(call.args[0], relax.GlobalVar):
        return None
    func = mod[call.args[0]]
    op = op_of(func) if isinstance(func, tvm.tirx.PrimFunc) else None
    if op is None:
        return None
    return op, func, dict(zip(inputs_of(func), call.args[1].fields))


def bound_constant(mutator: relax.PyExprMutator, expr: relax.Expr):
    """The numpy value of ``expr`` when it is a constant or a variable bound to one (in ``mutator``'s scope)."""
    if isinstance(expr, relax.Var):
        bound = mutator.lookup_binding(expr)
        expr = bound if bound is not None else expr
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None
