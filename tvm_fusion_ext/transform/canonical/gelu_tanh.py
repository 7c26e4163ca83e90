"""Tanh-approximated GELU spelt as elementwise ops → ``R.nn.gelu_tanh``.

Pattern: ``0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))`` with ``x³`` written ``x ** 3`` (HF
``NewGELUActivation``) or ``x · x · x`` (torch's legacy exporter), or the factored tanh argument
``x · √(2/π) · (1 + 0.044715 · x · x)`` (HF ``FastGELUActivation``), in the three multiply orders of
:func:`half_x_products`.
Check: every constant has its exact value and none broadcasts ``x``.
Rewrite: ``gelu_tanh(x)``.
"""

from __future__ import annotations

import math
from typing import List, Optional

from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from ..rule import FusionRule, Match, Variant
from ._elementwise import check_constant, check_keeps_type, first_reason, half_x_products

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_KAPPA = 0.044715


class TanhGeluToGeluTanh(FusionRule):
    name = "TanhGeluToGeluTanh"
    kind = "canonical"

    def variants(self) -> List[Variant]:
        x = wildcard()
        three, kappa, beta, one, half = is_const(), is_const(), is_const(), is_const(), is_const()
        # the factored form gets its own constant patterns: an alternative that fails half-way must not
        # leave a binding behind for the one that matches
        f_kappa, f_beta, f_one = is_const(), is_const(), is_const()
        mul, add = is_op("relax.multiply"), is_op("relax.add")
        cube = is_op("relax.power")(x, three) | mul(mul(x, x), x)
        tanh_arg = (mul(beta, add(x, mul(kappa, cube)))
                    | mul(mul(x, f_beta), add(f_one, mul(mul(f_kappa, x), x))))
        one_plus_tanh = add(is_op("relax.tanh")(tanh_arg), one)
        names = {"x": x, "three": three, "kappa": kappa, "beta": beta, "one": one, "half": half,
                 "f_kappa": f_kappa, "f_beta": f_beta, "f_one": f_one}
        return [Variant(root, names, {"order": order})
                for order, root in half_x_products(x, one_plus_tanh, half)]

    def check(self, m: Match) -> Optional[str]:
        if m.has("f_beta"):
            tanh_arg = (check_constant(m, "f_kappa", _KAPPA, "quadratic coefficient"),
                        check_constant(m, "f_one", 1.0, "constant added to the quadratic term"),
                        check_constant(m, "f_beta", _SQRT_2_OVER_PI, "tanh scale"))
        else:
            tanh_arg = (check_constant(m, "three", 3.0, "exponent") if m.has("three") else None,
                        check_constant(m, "kappa", _KAPPA, "cubic coefficient"),
                        check_constant(m, "beta", _SQRT_2_OVER_PI, "tanh scale"))
        return first_reason(
            *tanh_arg,
            check_constant(m, "one", 1.0, "constant added to tanh"),
            check_constant(m, "half", 0.5, "outer factor"),
            check_keeps_type(m),
        )

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        return relax.op.nn.gelu_tanh(m.arg("x"))
