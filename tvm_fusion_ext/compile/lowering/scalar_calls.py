"""Keep kernels that read a dim only as a scalar argument out of fused groups.

``R.shape_to_tensor(R.shape([n]))`` legalizes to a PrimFunc that takes ``n`` as a scalar parameter and no
buffer whose shape holds it. When ``FuseOps`` puts such a call in a group, the group's Relax function takes
``n`` as an ``R.Prim`` parameter, and ``FuseTIR`` then defines ``n`` twice in the fused PrimFunc: TVM 0.27 stops
in ``RenewDefs`` ("VarRemapGet(source) == nullptr"). Dynamo exports of decoders with a KV cache and
independent mask dims build exactly this (the past length turned into a position tensor), and the whole
compile died inside TVM. Marking those PrimFuncs opaque leaves each such call a kernel of its own: a
one-element kernel, so nothing measurable is lost.
"""

from __future__ import annotations

from typing import Set

import tvm
from tvm import relax

_OPAQUE = 8  # relay/relax OpPatternKind.kOpaque: FuseOps never groups it


def _tir_vars(expr) -> Set:
    return set(tvm.tirx.analysis.undefined_vars(expr))


def _is_scalar(item) -> bool:
    # 0.27 passes a scalar argument as the PrimExpr itself (older TVM wrapped it in PrimValue)
    return isinstance(getattr(item, "ty", None), tvm.ir.PrimType)


def _shape_vars(sinfo) -> Set:
    return set(relax.analysis.tir_vars_in_type(sinfo))


def scalar_only_callees(mod: tvm.IRModule) -> Set[str]:
    """Names of the PrimFuncs some ``call_tir`` passes a scalar whose dims none of its tensors' shapes hold."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    found: Set[str] = set()

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(call_tir):
            callee, args = expr.args[0], expr.args[1]
            items = list(args.fields) if isinstance(args, relax.Tuple) else [args]
            scalars = set()
            shapes = _shape_vars(expr.ty)
            for item in items:
                if _is_scalar(item):
                    scalars |= _tir_vars(item)
                else:
                    shapes |= _shape_vars(item.ty)
            if len(expr.args) > 2:
                shapes |= _shape_vars(expr.args[2].ty)
            if scalars - shapes:
                found.add(callee.name_hint)

    for _gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def KeepScalarCallsUnfused() -> tvm.transform.Pass:  # noqa: N802
    """Mark :func:`scalar_only_callees` opaque (after ``AnnotateTIROpPattern``, before ``FuseOps``)."""

    @tvm.transform.module_pass(opt_level=0, name="tfx.KeepScalarCallsUnfused")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        names = scalar_only_callees(mod)
        if not names:
            return mod
        out = mod.clone()  # a Python module pass gets the caller's module
        for gv, func in list(mod.functions_items()):
            if gv.name_hint in names and isinstance(func, tvm.tirx.PrimFunc):
                out[gv] = func.with_attr("op_pattern", _OPAQUE)
        return out

    return _pass
