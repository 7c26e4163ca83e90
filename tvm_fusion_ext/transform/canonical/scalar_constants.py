"""Arithmetic on one-element constants → the constant it computes.

torch's ``nn.MultiheadAttention`` (so ``nn.TransformerEncoderLayer``, and WavLM, which calls its functional
form) computes the softmax scale at run time from the head dim, ``sqrt(1 / sqrt(d))``, and multiplies q and k by
it. Both exporters keep that chain of ``Sqrt``/``Div`` on one-element constants, and TVM's importer keeps it too;
the attention rules take a scale only as a constant, so they saw none and the attention stayed unfused.

Pattern: an elementwise op (``sqrt``, ``rsqrt``, ``divide``, ``multiply``, ``add``, ``subtract``, ``power``,
``exp``, ``log``, ``negative``, ``astype``) with a floating-point result of one element.
Check (in the matcher): every operand is a one-element constant, or such an op over them (recursively, a few
levels deep); anything computed from an input, or an integer op (a size: the shape rules read those), matches
nothing.
Rewrite: the constant, computed with numpy in the op's dtype (float32 ops in float32: ``sqrt`` and the four
arithmetic ops are correctly rounded there, as in the kernel TVM would otherwise build).
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
from tvm import relax

from ..graph import FunctionGraph, const_value, op_name
from ..rule import Found, FusionRule, Match, Matcher, Variant

_UNARY = {"relax.sqrt": np.sqrt, "relax.rsqrt": lambda x: 1 / np.sqrt(x), "relax.exp": np.exp,
          "relax.log": np.log, "relax.negative": np.negative}
_BINARY = {"relax.divide": np.divide, "relax.multiply": np.multiply, "relax.add": np.add,
           "relax.subtract": np.subtract, "relax.power": np.power}
_DEPTH = 8  # the scale chains seen are 3 ops deep; a long chain is not a scale


def _dtype(e: relax.Expr) -> Optional[str]:
    ty = getattr(e, "ty", None)
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else None


def _value(e: relax.Expr, graph: FunctionGraph, depth: int = 0) -> Optional[np.ndarray]:
    """The one-element array ``e`` computes from constants alone, else None."""
    e = graph.value(e)
    value = const_value(e)
    if value is not None:
        return value if value.size == 1 else None
    if depth >= _DEPTH or not isinstance(e, relax.Call):
        return None
    dtype = _dtype(e)
    if dtype is None or not dtype.startswith("float"):
        return None  # sizes are integers (and numpy has no bfloat16 to compute in)
    op = op_name(e)
    if op == "relax.astype":
        x = _value(e.args[0], graph, depth + 1)
        return None if x is None else x.astype(dtype)
    if op in _UNARY:
        x = _value(e.args[0], graph, depth + 1)
        return None if x is None or str(x.dtype) != dtype else _UNARY[op](x).astype(dtype)
    if op in _BINARY:
        a, b = (_value(arg, graph, depth + 1) for arg in e.args[:2])
        if a is None or b is None or str(a.dtype) != dtype or str(b.dtype) != dtype:
            return None
        with np.errstate(all="ignore"):  # a division by zero is what the graph computes (inf), not our error
            return _BINARY[op](a, b).astype(dtype)
    return None


class _ScalarConstantMatcher(Matcher):
    def match(self, root: relax.Var, graph: FunctionGraph) -> Optional[Found]:
        value = graph.var2val[root]
        if const_value(value) is not None:
            return None
        folded = _value(value, graph)
        if folded is None:
            return None
        shape = tuple(int(d) for d in value.ty.shape.values) if value.ty.shape is not None else None
        if shape is None or int(np.prod(shape, dtype=np.int64)) != 1:
            return None
        return Found({"value": folded.reshape(shape)})


class FoldScalarConstants(FusionRule):
    name = "FoldScalarConstants"
    kind = "canonical"

    def variants(self) -> List[Variant]:
        matcher = _ScalarConstantMatcher()
        return [Variant(matcher, root_op=op) for op in (*_UNARY, *_BINARY, "relax.astype")]

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        value = m["value"]
        return relax.const(value, str(value.dtype))
