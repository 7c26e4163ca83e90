"""``matmul(q · c1, kᵀ · c2)`` → ``matmul(q, kᵀ) · (c1 · c2)``.

SDPA exports scale both attention operands by d^-¼ before q·kᵀ (numerically kinder in fp16). The matmul is
bilinear, so scalar factors on either operand move out of it exactly in real arithmetic, whatever their
signs; in floating point the result differs by rounding only. ``/ c`` counts as ``· 1/c``.

Pattern
    ``matmul(a · ca | a / ca, b · cb | b / cb)``.
Check
    both factors are scalar constants (a tensor factor would scale rows/columns, not the product) that do
    not broadcast their operand to another shape. Only the two-sided form is rewritten: moving a one-sided
    scale onto the (larger, S×T) product would cost work unless an attention fusion absorbs it, and the
    attention rule already reads a scale on q or k directly.
Rewrite
    ``matmul(a, b) · c`` with ``c`` the product of the two factors.
"""

from __future__ import annotations

from typing import List, Optional

import tvm_ffi
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ..graph import scalar_value
from ..rule import FusionRule, Match, Variant


class MergeSplitAttentionScale(FusionRule):
    name = "MergeSplitAttentionScale"
    kind = "canonical"

    def variants(self) -> List[Variant]:
        out = []
        for op_a in ("relax.multiply", "relax.divide"):
            for op_b in ("relax.multiply", "relax.divide"):
                a, ca, b, cb = wildcard(), wildcard(), wildcard(), wildcard()
                sa, sb = is_op(op_a)(a, ca), is_op(op_b)(b, cb)
                root = is_op("relax.matmul")(sa, sb)
                out.append(Variant(root, {"a": a, "ca": ca, "b": b, "cb": cb, "sa": sa, "sb": sb},
                                   {"a": op_a, "b": op_b}, "relax.matmul"))
        return out

    def _factor(self, m: Match, side: str) -> Optional[float]:
        c = scalar_value(m.value("c" + side))
        if c is None:
            return None
        if m.tag[side] == "relax.divide":
            return None if c == 0.0 else 1.0 / c
        return c

    def check(self, m: Match) -> Optional[str]:
        for side in ("a", "b"):
            if m[side].ty.shape is None or self._factor(m, side) is None:
                return f"the factor on matmul operand {side} is not a nonzero scalar constant"
            if not tvm_ffi.structural_equal(m[side].ty, m["s" + side].ty):
                return f"the factor on matmul operand {side} changes its type"
        out_dtype = str(m.value("sa").ty.dtype)
        if str(m.root_var.ty.dtype) != out_dtype:
            return "the matmul changes dtype"
        return None

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        c = self._factor(m, "a") * self._factor(m, "b")
        mm = bb.emit(relax.op.matmul(m.arg("a"), m.arg("b"), out_dtype=str(m.root_var.ty.dtype)))
        return relax.op.multiply(mm, relax.const(c, str(m.root_var.ty.dtype)))
