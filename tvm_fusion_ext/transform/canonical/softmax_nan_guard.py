"""``where(isnan(p), 0, p)`` with ``p = softmax(x)`` → ``p``, when ``x`` cannot have a row of only -inf.

SDPA exports guard the attention probabilities against fully masked rows: softmax of a row whose every
entry is -inf is 0/0 = NaN, and the guard turns it into 0. Softmax of a row with at least one finite entry
(and no NaN/+inf) is never NaN: the max is subtracted first, so one term is exp(0) = 1 and the sum is >= 1.
So the guard can only change a result when -inf (or NaN) reaches the softmax input.

Choice made here: drop the guard only when every tensor that reaches ``x`` through elementwise/shape ops is
built from finite constants or integer/boolean data (the dynamo export's mask ``where(mask, 0, -3.4e38)``,
a ``(1 - mask) · -10000`` mask, no mask at all), or is an activation (a matmul, norm, ... output), taken to be
finite and far below float max. A fully masked row then gives the same uniform row with or without the
guard. A guard over a -inf constant (the legacy export's ``where(mask, 0, -inf)``) or over a float mask that
is a function input (it may hold -inf) stays; the attention fusion absorbs it, because ``fused_attention``
defines a row with no visible key as 0, the guard's own answer.

The walk is conservative: an op not known to keep finite values finite (exp, log, division by a
non-constant, ...) counts as "may carry -inf".

Pattern
    ``where(isnan(p), zero, p)``.
Check
    ``p`` is a softmax, ``zero`` the constant 0 without broadcasting ``p``, and the softmax input cannot hold
    -inf (:func:`may_be_nonfinite`).
Rewrite
    ``p``.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ..graph import FunctionGraph, const_value, is_constant, op_name, scalar_value
from ..report import ExpectedRefusal
from ..rule import FusionRule, Match, Variant

# ops whose output is finite when their inputs are (up to overflow, which the contract above excludes)
_TRANSPARENT = {
    "relax.add", "relax.subtract", "relax.multiply", "relax.negative", "relax.where", "relax.astype",
    "relax.reshape", "relax.permute_dims", "relax.broadcast_to", "relax.expand_dims", "relax.squeeze",
    "relax.strided_slice", "relax.take", "relax.concat", "relax.maximum", "relax.minimum", "relax.clip",
}
# producers of activations: finite by contract, the walk stops there
_ACTIVATION = {
    "relax.matmul", "relax.nn.layer_norm", "relax.nn.rms_norm", "relax.nn.softmax", "relax.nn.gelu",
    "relax.nn.gelu_tanh", "relax.nn.silu", "relax.nn.relu", "relax.sigmoid", "relax.tanh", "relax.erf",
    "relax.call_tir", "relax.nn.conv2d",
}
_MAX_DEPTH = 32


def may_be_nonfinite(e: relax.Expr, graph: FunctionGraph, depth: int = 0) -> bool:
    """Conservative: True unless ``e`` is provably free of -inf/+inf/NaN under the finite-activation contract."""
    e = graph.value(e)
    ty = getattr(e, "ty", None)
    if isinstance(ty, relax.TensorType) and ty.dtype is not None:
        dtype = str(ty.dtype)
        if dtype == "bool" or dtype.startswith("int") or dtype.startswith("uint"):
            return False
    if isinstance(e, relax.Var):
        return True  # a float function input reached without an activation op: a mask, may hold -inf
    if is_constant(e):
        v = const_value(e)
        return not (v.dtype == bool or not np.issubdtype(v.dtype, np.floating) or np.isfinite(v).all())
    if isinstance(e, relax.ShapeExpr) or not isinstance(e, relax.Expr):
        return False
    name = op_name(e)
    if name is None or depth > _MAX_DEPTH:
        return True
    if name in _ACTIVATION:
        return False
    if name == "relax.divide":
        c = scalar_value(graph.value(e.args[1]))
        return c is None or c == 0 or may_be_nonfinite(e.args[0], graph, depth + 1)
    if name in _TRANSPARENT:
        return any(may_be_nonfinite(a, graph, depth + 1) for a in e.args
                   if isinstance(a, relax.Expr) and not isinstance(a, relax.ShapeExpr))
    return True


class DropSoftmaxNanGuard(FusionRule):
    name = "DropSoftmaxNanGuard"
    kind = "canonical"

    def variants(self) -> List[Variant]:
        p, zero = wildcard(), wildcard()
        root = is_op("relax.where")(is_op("relax.isnan")(p), zero, p)
        return [Variant(root, {"p": p, "zero": zero}, {}, "relax.where")]

    def check(self, m: Match) -> Optional[str]:
        sm = m.value("p")
        if op_name(sm) != "relax.nn.softmax":
            return "the guarded tensor is not a softmax"
        if m.scalar("zero") != 0.0:
            return "the guard's replacement is not the constant 0"
        if not tvm_ffi.structural_equal(m.root_var.ty, m["p"].ty):
            return "the guard's 0 broadcasts the probabilities"
        if may_be_nonfinite(sm.args[0], m.graph):
            # correct, not a miss: a row whose every score is -inf softmaxes to NaN, and the guard makes it 0
            return ExpectedRefusal("the softmax input may hold -inf (a -inf mask): fully masked rows need the guard")
        return None

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        return m.arg("p")
