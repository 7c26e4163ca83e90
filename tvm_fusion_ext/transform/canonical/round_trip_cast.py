"""``astype(astype(x, wide), dtype of x)`` → ``x``, when ``wide`` holds every value of ``x``'s dtype exactly.

Torch's legacy exporter writes a float16 model's ``softmax(..., dtype=float32).to(float16)`` (Hugging Face's
eager attention) as a float16 ``Softmax`` followed by ``Cast`` to float32 and ``Cast`` back to float16. The two
casts give back ``x`` bit for bit (float16 → float32 is exact), but they sit between the softmax and the second
matmul, where the attention rule looks for the probabilities, so that attention stayed unfused. A narrowing
round trip (float32 → float16 → float32) rounds and is left alone, as is one whose middle type cannot hold every
value (int64 → int32 → int64).

Pattern: ``astype(astype(x))``.
Check (in the matcher): the outer cast's result type is ``x``'s, and the inner dtype represents every value of
``x``'s dtype (:func:`widens`).
Rewrite: ``x``.
"""

from __future__ import annotations

from typing import List, Optional

import tvm_ffi
from tvm import relax

from ..graph import FunctionGraph, op_name
from ..rule import Found, FusionRule, Match, Matcher, Variant

# dtype -> the dtypes that hold every one of its values exactly
_WIDER = {
    "float16": {"float32", "float64"},
    "bfloat16": {"float32", "float64"},
    "float32": {"float64"},
    "bool": {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"},
    "int8": {"int16", "int32", "int64", "float32", "float64"},
    "int16": {"int32", "int64", "float32", "float64"},
    "int32": {"int64", "float64"},
    "uint8": {"int16", "int32", "int64", "uint16", "uint32", "uint64", "float32", "float64"},
}


def widens(source: str, middle: str) -> bool:
    """``middle`` holds every value of ``source`` exactly."""
    return middle in _WIDER.get(source, ())


class _RoundTripMatcher(Matcher):
    # a cast that is no exact round trip matches nothing (and reports nothing): most casts are real ones
    def match(self, root: relax.Var, graph: FunctionGraph) -> Optional[Found]:
        outer = graph.var2val[root]
        if op_name(outer) != "relax.astype":
            return None
        inner = graph.value(outer.args[0])
        if op_name(inner) != "relax.astype":
            return None
        x = inner.args[0]
        if not isinstance(x.ty, relax.TensorType) or not tvm_ffi.structural_equal(x.ty, root.ty):
            return None
        if not widens(str(x.ty.dtype), str(inner.attrs.dtype)):
            return None
        return Found({"x": x})  # the inner cast stays for any other reader (else it is dead code)


class DropRoundTripCast(FusionRule):
    name = "DropRoundTripCast"
    kind = "canonical"

    def variants(self) -> List[Variant]:
        return [Variant(_RoundTripMatcher(), root_op="relax.astype")]

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        return m.arg("x")
