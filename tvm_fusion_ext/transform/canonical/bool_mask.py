"""Boolean masks applied with ``where`` → additive masks: ``softmax(where(keep, s, NEG))`` →
``softmax(s + where(keep, 0, NEG))`` (and ``where(drop, NEG, s)`` → ``s + where(drop, NEG, 0)``).

``masked_fill``-style masking (causal ``where(tril, s, -inf)``, HF ``masked_fill(~mask, finfo.min)``) selects
between the scores and a big negative number; attention fusion understands only an additive mask, which
also keeps the mask at its own (small, broadcast) shape instead of the scores'.

Exactness: where keep is true both give ``s``. Where it is false the where-form gives NEG and the additive
form ``s + NEG``. With NEG = -inf both are -inf (for finite s). With a finite NEG at or below -1e30 (e.g.
float32 min, -3.4e38) ``s + NEG`` rounds to NEG for any |s| < 1e22, so both are the same number. A small NEG
such as -10000 is *not* rewritten: a fully masked row would turn from uniform into softmax(s).

The idiom is only rewritten under a softmax (that is where the additive form is the canonical one); the
real exports' own masks (``scores + where(mask, 0, -inf)``, dynamo's ``where(mask, 0, -3.4e38)`` shared by
all layers) are already additive and need nothing.

Pattern
    ``softmax([reshape] (where(cond, s, NEG) [+ other]))`` or the same with ``where(cond, NEG, s)``, ``s`` not a
    constant (the reshape: FSMT masks a ``[B, H, S, T]`` view of its ``[B·H, S, T]`` scores).
Check
    ``cond`` is boolean; NEG is one value, -inf or <= -1e30; the select does not broadcast ``s``.
Rewrite
    ``softmax([reshape] (s + where(cond, 0, NEG) [+ other]))`` (or ``where(cond, NEG, 0)``), same softmax axis
    and view.
"""

from __future__ import annotations

import math
from typing import List, Optional

import tvm_ffi
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from ..graph import uniform_value
from ..rule import FusionRule, Match, Variant

#: a select value at or below this is "minus infinity" (see the module docstring)
BIG_NEGATIVE = -1e30


class BoolMaskToAdditive(FusionRule):
    name = "BoolMaskToAdditive"
    kind = "canonical"

    def variants(self) -> List[Variant]:
        out = []
        for keep_first in (True, False):  # where(keep, s, NEG) | where(drop, NEG, s)
            for extra in (False, True):  # the select alone under the softmax, or plus another additive mask
                # the masked scores reach the softmax directly, or through a reshape: FSMT (fairseq) masks a
                # [B, H, S, T] view of its [B·H, S, T] scores and views them back for the softmax
                for view in (False, True):
                    # the selected tensor is not a constant: where(mask, 0, -inf) is already an additive mask
                    cond, s, neg, other, shape = wildcard(), ~is_const(), wildcard(), wildcard(), wildcard()
                    sel = is_op("relax.where")(cond, s, neg) if keep_first else is_op("relax.where")(cond, neg, s)
                    x = is_op("relax.add")(sel, other) if extra else sel
                    x = is_op("relax.reshape")(x, shape) if view else x
                    root = is_op("relax.nn.softmax")(x)
                    names = {"cond": cond, "s": s, "neg": neg, "sel": sel}
                    if extra:
                        names["other"] = other
                    if view:
                        names["shape"] = shape
                    out.append(Variant(root, names, {"keep_first": keep_first, "extra": extra, "view": view},
                                       "relax.nn.softmax"))
        return out

    def check(self, m: Match) -> Optional[str]:
        if str(m["cond"].ty.dtype) != "bool":
            return "the select condition is not boolean"
        neg = uniform_value(m.value("neg"))
        if neg is None or not (neg <= BIG_NEGATIVE or neg == -math.inf):
            return f"the masked value {neg} is not -inf or <= {BIG_NEGATIVE:g} (not equivalent to adding it)"
        if not tvm_ffi.structural_equal(m["s"].ty, m["sel"].ty):
            return "the mask broadcasts the scores to a larger shape"
        return None

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        dtype = str(m["s"].ty.dtype)
        zero = relax.const(0.0, dtype)
        neg = relax.const(uniform_value(m.value("neg")), dtype)
        cond = m.arg("cond")
        add_mask = relax.op.where(cond, zero, neg) if m.tag["keep_first"] else relax.op.where(cond, neg, zero)
        x = bb.emit(relax.op.add(m.arg("s"), bb.emit(add_mask)))
        if m.tag["extra"]:
            x = bb.emit(relax.op.add(x, m.arg("other")))
        if m.tag["view"]:
            x = bb.emit(relax.op.reshape(x, m.arg("shape")))
        return relax.op.nn.softmax(x, axis=int(m.root_value.attrs.axis))
