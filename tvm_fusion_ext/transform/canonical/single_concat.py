"""``concat((x,), axis)`` → ``x``.

The legacy torch exporter writes BLOOM's (and other cache-aware models') key/value "concatenate with the cache"
as a Concat of one input when no cache is given. It copies ``x`` unchanged, but it stands between a head split
and the attention's matmul, where the attention matcher reads what each axis means: reading ``x`` itself gives
the rules the plain graph.

Pattern: ``concat(t)``.
Check (in the matcher): ``t`` is a tuple of exactly one tensor; a real concatenation matches nothing.
Rewrite: ``x``.
"""

from __future__ import annotations

from typing import List, Optional

from tvm import relax

from ..graph import FunctionGraph, op_name
from ..rule import Found, FusionRule, Match, Matcher, Variant


class _SingleConcatMatcher(Matcher):
    def match(self, root: relax.Var, graph: FunctionGraph) -> Optional[Found]:
        value = graph.var2val[root]
        if op_name(value) != "relax.concat":
            return None
        parts = graph.value(value.args[0])
        if not isinstance(parts, relax.Tuple) or len(parts.fields) != 1:
            return None
        return Found({"x": parts.fields[0]})


class DropSingleConcat(FusionRule):
    name = "DropSingleConcat"
    kind = "canonical"

    def variants(self) -> List[Variant]:
        return [Variant(_SingleConcatMatcher(), root_op="relax.concat")]

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        return m.arg("x")
