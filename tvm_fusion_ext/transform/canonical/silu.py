"""``x · sigmoid(x)`` → ``R.nn.silu(x)``.

Pattern: a multiply whose operands are ``x`` and ``sigmoid`` of the very same ``x`` (either order: dpl matches
``relax.multiply`` commutatively). ``x · sigmoid(y)`` is a gate (GLU-style), not SiLU, and does not match.
Check: the product keeps ``x``'s type.
Rewrite: ``silu(x)``.
"""

from __future__ import annotations

from typing import List, Optional

from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ..rule import FusionRule, Match, Variant
from ._elementwise import check_keeps_type


class SigmoidMulToSilu(FusionRule):
    name = "SigmoidMulToSilu"
    kind = "canonical"

    def variants(self) -> List[Variant]:
        x = wildcard()
        return [Variant(is_op("relax.multiply")(x, is_op("relax.sigmoid")(x)), {"x": x})]

    def check(self, m: Match) -> Optional[str]:
        return check_keeps_type(m)

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        return relax.op.nn.silu(m.arg("x"))
