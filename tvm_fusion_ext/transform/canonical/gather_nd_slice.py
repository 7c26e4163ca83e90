"""``gather_nd(x, idx)`` with ``idx`` a single index into x's leading axes → a slice of length 1 there.

The dynamo exporter spells ``x[:, :, -2]`` on a tensor whose head axis it first moved to the front as
``GatherND(Transpose(x), idx)``, with ``idx`` the negative index normalised at run time from the tensor's own
shape (``where(i < 0, i + Shape(x)[0], i)``): Falcon's multi-query K and V, picked from the fused QKV
projection's last two heads. The attention matcher follows axes through slices and permutes, not through
``gather_nd``, so it read the picked head as a batch axis and refused ("batch/heads differ"). A slice says
what the gather means.

Pattern: ``gather_nd(x, idx, batch_dims=0)``.
Check (in the matcher): ``idx`` has the static shape ``[1, m]`` and evaluates, from the sizes it is computed
from (:class:`~tvm_fusion_ext.frontend.symbolic_values.Evaluator`), to constants inside x's leading ``m`` extents
(after the negative-index rule); anything else is a real gather and matches nothing.
Rewrite: ``strided_slice(x, axes 0..m-1, [i, i+1))`` (shape ``[1, ..., 1, *rest]``), reshaped to gather_nd's
``[1, *rest]``.
"""

from __future__ import annotations

from typing import List, Optional

from tvm import relax, tirx

from ...frontend.symbolic_values import Evaluator
from ..graph import FunctionGraph, op_name, shape_dims
from ..rule import Found, FusionRule, Match, Matcher, Variant


class _SingleIndexGatherMatcher(Matcher):
    def match(self, root: relax.Var, graph: FunctionGraph) -> Optional[Found]:
        value = graph.var2val[root]
        if op_name(value) != "relax.gather_nd" or int(value.attrs.batch_dims) != 0:
            return None
        x, idx = value.args
        x_dims, idx_dims = shape_dims(x), shape_dims(idx)
        if x_dims is None or idx_dims is None or len(idx_dims) != 2 or idx_dims[0] != 1:
            return None
        m = idx_dims[1]
        if not isinstance(m, int) or not 1 <= m <= len(x_dims) or not all(isinstance(d, int) for d in x_dims[:m]):
            return None
        elements = Evaluator.of_function(graph.func).elements(idx)
        if elements is None or not all(isinstance(e, tirx.IntImm) for e in elements):
            return None
        starts = []
        for i, extent in zip((int(e) for e in elements), x_dims[:m]):
            i = i + extent if i < 0 else i
            if not 0 <= i < extent:
                return None  # out of range: leave the gather to report it at run time
            starts.append(i)
        return Found({"x": x, "starts": starts})


class GatherNDToSlice(FusionRule):
    name = "GatherNDToSlice"
    kind = "canonical"

    def variants(self) -> List[Variant]:
        return [Variant(_SingleIndexGatherMatcher(), root_op="relax.gather_nd")]

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        starts = m["starts"]
        x = m.arg("x")
        axes = list(range(len(starts)))
        sliced = bb.emit(relax.op.strided_slice(x, axes, starts, [s + 1 for s in starts]))
        rest = shape_dims(m["x"])[len(starts):]
        return relax.op.reshape(sliced, [1, *rest]) if len(starts) > 1 else sliced
