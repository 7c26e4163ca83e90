"""Exact GELU spelt as elementwise ops → ``R.nn.gelu``.

Pattern: ``0.5 · x · (1 + erf(x / √2))`` with the erf argument written ``x / √2`` or ``x · (1/√2)``, and the
three multiply orders of :func:`half_x_products` (torch's legacy exporter and the dynamo exporter differ here).
Check: every constant has its exact value (to the rounding of its dtype) and none broadcasts ``x``.
Rewrite: ``gelu(x)``.
"""

from __future__ import annotations

import math
from typing import List, Optional

from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from ..rule import FusionRule, Match, Variant
from ._elementwise import check_constant, check_keeps_type, first_reason, half_x_products


class ErfGeluToGelu(FusionRule):
    name = "ErfGeluToGelu"
    kind = "canonical"

    def variants(self) -> List[Variant]:
        x = wildcard()
        sqrt2, inv_sqrt2, one, half = is_const(), is_const(), is_const(), is_const()
        erf_arg = is_op("relax.divide")(x, sqrt2) | is_op("relax.multiply")(x, inv_sqrt2)
        one_plus_erf = is_op("relax.add")(is_op("relax.erf")(erf_arg), one)
        names = {"x": x, "sqrt2": sqrt2, "inv_sqrt2": inv_sqrt2, "one": one, "half": half}
        return [Variant(root, names, {"order": order})
                for order, root in half_x_products(x, one_plus_erf, half)]

    def check(self, m: Match) -> Optional[str]:
        if m.has("sqrt2"):
            scale = check_constant(m, "sqrt2", math.sqrt(2.0), "erf divisor")
        else:
            scale = check_constant(m, "inv_sqrt2", 1.0 / math.sqrt(2.0), "erf scale")
        return first_reason(
            scale,
            check_constant(m, "one", 1.0, "constant added to erf"),
            check_constant(m, "half", 0.5, "outer factor"),
            check_keeps_type(m),
        )

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        return relax.op.nn.gelu(m.arg("x"))
