"""What the converter families share: the base class of a fixed converter, the scalar lifting TVM's binary
converters need, and size helpers (a dim's text in errors, int elements of a size input, size factors).

Nothing here imports TVM at module level, so that importing the front end stays cheap."""

from __future__ import annotations

import re
from typing import List, Optional

import numpy as np

from ..errors import Unsupported


class Fixed:
    """Routes every opset to :meth:`convert`, which gets the stock converter for that opset as ``stock``; a fixed
    converter subclasses this and TVM's converter for the op (``class IsInf(Fixed, of.IsInf)``)."""

    @classmethod
    def get_converter(cls, opset):
        stock = super().get_converter(opset)

        def convert(bb, inputs, attr, params):
            return cls.convert(bb, inputs, attr, params, opset, stock)

        return convert

    @classmethod
    def convert(cls, bb, inputs, attr, params, opset, stock):
        raise NotImplementedError


def dtype_of(x) -> str:
    return str(x.ty.dtype)


def ndim_of(x) -> int:
    return len(x.ty.shape.values)


class LiftedScalars:
    """A binary converter whose scalar size operands (a dim read with ``Shape → Gather``, which TVM's importer
    keeps as a bare TIR expression) become tensors when the other operand is a tensor of more than one element.
    TVM's binary converters fold such a pair with numpy and then take ``.item()`` of the result, which fails for
    ``Range(17) + size`` (BEiT's interpolated relative positions); with a tensor that is not constant they pass
    the bare expression to a tensor op. ``Div`` of two sizes is taken in floor form (see :func:`_size_quotient`)."""

    def __init__(self, inner, op: str):
        self.inner, self.op = inner, op

    def get_converter(self, opset):
        convert = self.inner.get_converter(opset)

        def lifted(bb, inputs, attr, params):
            if self.op == "Div":
                quotient = _size_quotient(inputs)
                if quotient is not None:
                    return quotient
            return convert(bb, _lift_scalars(bb, inputs), attr, params)

        return lifted


def _size_quotient(inputs):
    """``Div`` of a size kept as a bare scalar by a positive integer, as ``floordiv`` (the same value for a size; see
    :func:`.symbolic_values.is_size_division`); None for anything else."""
    import tvm
    from tvm import relax, tirx

    from ..symbolic_values import is_size_division

    if len(inputs) != 2 or not any(tvm.ir.is_prim_expr(x) and not isinstance(x, tirx.IntImm) for x in inputs):
        return None
    a, b = (x if tvm.ir.is_prim_expr(x) else _scalar_int(x) for x in inputs)
    if a is None or b is None or not str(a.ty).startswith("int") or str(a.ty) != str(b.ty):
        return None
    return relax.prim_value(tirx.floordiv(a, b)) if is_size_division(a, b) else None


def rounded_size_quotient(x, up: bool):
    """``floor`` or ``ceil`` of a size divided in floats, ``float(a) / c`` with ``a`` an integer size expression
    and ``c`` a positive whole number, as the integer quotient it is, cast back to ``x``'s float type:
    ``float(floordiv(a + c - 1, c))`` for ``ceil``. Exporters write size arithmetic this way (MobileViT's
    ``ceil(h / p) * p``, a pooled length's ``floor((L - k) / s)``); TVM's unary converters take tensors only, and
    an integer quotient keeps the later shapes readable to the analyzer. None for any other expression."""
    from tvm import tirx

    if not isinstance(x, tirx.Div) or not isinstance(x.b, tirx.FloatImm) or not isinstance(x.a, tirx.Cast):
        return None
    c, a = float(x.b.value), x.a.value
    if c <= 0 or c != int(c) or not str(a.ty).startswith("int"):
        return None
    c = tirx.IntImm(str(a.ty), int(c))
    return tirx.Cast(str(x.ty), tirx.floordiv(a + c - 1, c) if up else tirx.floordiv(a, c))


def size_factors(e):
    """The factors of a size expression's product form (``batch * 4 * seq`` → batch, 4, seq), each int64."""
    from tvm import tirx

    if isinstance(e, tirx.Mul):
        return size_factors(e.a) + size_factors(e.b)
    return [e if str(e.ty) == "int64" else tirx.Cast("int64", e)]


def _scalar_int(x):
    import tvm
    from tvm import tirx

    if not isinstance(x, tvm.ir.GenericConst):
        return None
    arr = x.value.numpy()
    if arr.size != 1 or arr.dtype.kind not in "iu":
        return None
    return tirx.IntImm(str(arr.dtype), int(arr.reshape(-1)[0]))


def _lift_scalars(bb, inputs):
    import tvm
    from tvm import relax, tirx

    def is_tensor(x):
        ty = getattr(x, "ty", None)
        return isinstance(x, relax.Expr) and isinstance(ty, relax.TensorType) and ty.ndim != 0

    if not (any(tvm.ir.is_prim_expr(x) for x in inputs) and any(is_tensor(x) for x in inputs)):
        return inputs
    return [scalar_tensor(bb, x) if tvm.ir.is_prim_expr(x) else x for x in inputs]


def scalar_tensor(bb, x):
    """A bare TIR scalar (a size TVM's importer keeps unwrapped) as a 0-d tensor of its type."""
    from tvm import relax, tirx

    if isinstance(x, (tirx.IntImm, tirx.FloatImm)):
        return relax.const(x.value, str(x.ty))
    # a shape holds int64 only: a size cast to float (``x / x.shape[1]`` in a legacy export: Shape -> Gather ->
    # Cast(float) -> Div) goes in as the int it was cast from, and is cast back to its type below
    size = x.value if isinstance(x, tirx.Cast) else x
    if not str(size.ty).startswith(("int", "uint")):
        raise Unsupported(f"a size computed in {x.ty} arithmetic ({dim_text(x)}) used as a tensor")
    size = size if str(size.ty) == "int64" else tirx.Cast("int64", size)
    one = bb.normalize(relax.op.shape_to_tensor(relax.ShapeExpr([size])))  # int64, [1]
    t = bb.normalize(relax.op.reshape(one, relax.ShapeExpr([])))
    return t if str(x.ty) == "int64" else bb.normalize(relax.op.astype(t, str(x.ty)))


def dim_text(d) -> str:
    """A dim as an error shows it: ``4``, or the symbolic expression (``seq``, ``seq - 2``: TVM's own printing
    writes ``seq - T.int64(2)``, its script syntax, not what a user reads)."""
    return str(int(d)) if is_static(d) else _TYPED_INT.sub(r"\1", str(d))


_TYPED_INT = re.compile(r"T\.u?int(?:8|16|32|64)\((-?\d+)\)")


def is_static(d) -> bool:
    """A dim known at import: an int or an ``IntImm``."""
    from tvm import tirx

    return isinstance(d, (int, np.integer, tirx.IntImm))


def int_elements(bb, x) -> Optional[List]:
    """The int64 elements of a bounds input (constant, shape, or small tensor computed from sizes), or None."""
    import tvm
    from tvm import relax, tirx

    from ..symbolic_values import Evaluator

    if x is None:
        return None
    if isinstance(x, relax.ShapeExpr):
        return [i64(v) for v in x.values]
    if isinstance(x, tvm.ir.GenericConst):
        return [tirx.IntImm("int64", int(v)) for v in x.value.numpy().reshape(-1)]
    if isinstance(getattr(x, "ty", None), relax.ShapeType):
        values = x.ty.values
        return [i64(v) for v in values] if values is not None else None
    values = Evaluator(bb.lookup_binding).elements(x)
    return [i64(v) for v in values] if values is not None else None


def i64(v):
    """An int or an integer expression as an int64 expression."""
    from tvm import tirx

    if isinstance(v, int):
        return tirx.IntImm("int64", v)
    return v if str(v.ty) == "int64" else tirx.Cast("int64", v)


def static_int_inputs(bb, inputs, positions):
    """``inputs`` with each tensor at ``positions`` whose every element evaluates to an integer (see
    :mod:`..symbolic_values`) replaced by that constant; others are left as they are."""
    import tvm
    from tvm import relax, tirx

    from ..symbolic_values import Evaluator

    ev = Evaluator(bb.lookup_binding)
    for i in positions:
        x = inputs[i] if i < len(inputs) else None
        if x is None or isinstance(x, tvm.ir.GenericConst) or not isinstance(x, relax.Expr):
            continue
        values = ev.elements(x)
        if values and all(isinstance(v, tirx.IntImm) for v in values):
            inputs[i] = relax.const(np.array([int(v) for v in values], "int64"))
    return inputs

