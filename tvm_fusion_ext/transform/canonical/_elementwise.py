"""What the elementwise canonicalisations share: constant checks and the ways to write ``0.5 · x · f``.

A constant in an exporter idiom may be a scalar or a splat tensor; what matters is its value (within the
rounding of its dtype, no looser, so that a near miss like 0.7 for 1/√2 is refused) and that it does not
broadcast ``x`` to a bigger shape (the canonical op keeps ``x``'s shape, so that would change the result type).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import tvm_ffi
from tvm.relax.dpl import DFPattern, is_op

from ..graph import is_close, uniform_value
from ..rule import Match

# relative tolerance per dtype: fp32 exports of 1/√2 are within ~1e-7 of it, fp16 within half an ulp (~3e-4)
_REL_TOL = {"float16": 1e-3, "bfloat16": 8e-3}
_DEFAULT_REL_TOL = 1e-4


def rel_tolerance(dtype: str) -> float:
    return _REL_TOL.get(dtype, _DEFAULT_REL_TOL)


def check_constant(m: Match, name: str, expected: float, what: str) -> Optional[str]:
    """``None`` when ``m[name]`` is a constant whose elements all equal ``expected``, else the reason."""
    value = uniform_value(m.value(name))
    if value is None:
        return f"{what} is not a constant with one value"
    if not is_close(value, expected, rel=rel_tolerance(m.dtype(name))):
        return f"{what} is {value:.7g}, expected {expected:.7g}"
    return None


def check_keeps_type(m: Match, x_name: str = "x") -> Optional[str]:
    """The idiom's result must have ``x``'s type; anything else means a constant broadcast ``x``."""
    x_ty, out_ty = m[x_name].ty, m.root_var.ty
    if not tvm_ffi.structural_equal(x_ty, out_ty):
        return f"the idiom turns {x_ty} into {out_ty} (a constant broadcasts x)"
    return None


def first_reason(*reasons: Optional[str]) -> Optional[str]:
    return next((r for r in reasons if r is not None), None)


def half_x_products(x: DFPattern, f: DFPattern, half: DFPattern) -> List[Tuple[str, DFPattern]]:
    """``0.5 · x · f`` in the three association orders exporters emit.

    Operand order inside one multiply needs no variant: dpl matches ``relax.multiply`` commutatively.
    Legacy torch export: ``(x * f) * 0.5``; BERT-style source ``x * 0.5 * f``; dynamo: ``x * (0.5 * f)``.
    """
    mul = is_op("relax.multiply")
    return [
        ("(x*f)*0.5", mul(mul(x, f), half)),
        ("(x*0.5)*f", mul(mul(x, half), f)),
        ("x*(0.5*f)", mul(x, mul(half, f))),
    ]
