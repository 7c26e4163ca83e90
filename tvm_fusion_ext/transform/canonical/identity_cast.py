"""``astype(x, dtype of x)`` → ``x``.

The legacy torch exporter writes the fp32 upcast of a 16-bit model's RMSNorm (``x.to(float32)``) even when the
model is already fp32: an ONNX ``Cast`` to the type the tensor has. Such a cast changes nothing, yet a rule
that sees its result used twice (the norm and the next residual add read the cast, not ``x``) refuses to
swallow it. Reading ``x`` itself wherever the cast's result was read gives every rule the plain graph.

Pattern: ``astype(x)``.
Check (in the matcher): the result type equals ``x``'s, dtype and shape; any other cast is a real one and
matches nothing.
Rewrite: ``x``.
"""

from __future__ import annotations

from typing import List, Optional

import tvm_ffi
from tvm import relax

from ..graph import FunctionGraph, op_name
from ..rule import Found, FusionRule, Match, Matcher, Variant


class _IdentityCastMatcher(Matcher):
    # a cast that changes the dtype is no near miss of this rule: it matches nothing (and reports nothing)
    def match(self, root: relax.Var, graph: FunctionGraph) -> Optional[Found]:
        value = graph.var2val[root]
        if op_name(value) != "relax.astype":
            return None
        x = value.args[0]
        if not tvm_ffi.structural_equal(x.ty, root.ty):
            return None
        return Found({"x": x})


class DropIdentityCast(FusionRule):
    name = "DropIdentityCast"
    kind = "canonical"

    def variants(self) -> List[Variant]:
        return [Variant(_IdentityCastMatcher(), root_op="relax.astype")]

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        return m.arg("x")
