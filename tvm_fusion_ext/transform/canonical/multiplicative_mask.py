"""A 0/1 mask applied by multiplying → an additive mask: ``softmax(s · B + C)`` → ``softmax(s + C)``, with ``B`` a
constant of zeros and ones and ``C`` a constant that is 0 where ``B`` is 1 and hides a key where ``B`` is 0.

OpenAI GPT (and the first GPT-2 ports) mask the future as ``w · b + -1e4 · (1 - b)`` with ``b`` the lower
triangle of ones; the exporter folds ``-1e4 · (1 - b)`` into one constant. Attention fusion reads masks that are
added to the scores; a product of the scores with a tensor reads as a multiplicative mask and is refused, so the
attention of such models stayed unfused.

Exactness: where ``B`` is 1 both give ``s`` (``C`` is 0 there). Where ``B`` is 0 the product form gives ``C``
and the additive one ``s + C``: with ``C`` at or below -10000 (``padding_mask.HIDDEN``) both weigh exactly 0
after the softmax (``exp`` underflows below -104 in float32) as long as the row keeps a key it does not hide,
the assumption under which every finite mask value (BERT's -10000) is read as hiding a key. The check asks
that every row of ``B`` keeps a key, so ``B`` alone never empties a row. A row whose every kept key is hidden
by another mask (a padded query left of its sequence, under a causal ``B``) may differ: there the product form
spreads the row evenly over the keys ``B`` hid, the additive one by their scores; as in ``attention_mask.
split_causal``, such rows are not outputs anyone reads.

Pattern
    ``softmax(s · B + C [+ other])``, either operand order of the product and of the sum.
Check
    ``s`` is floating point and not a constant; ``B`` and ``C`` evaluate to constants (:func:`const_eval`);
    every value of ``B`` is 0 or 1 and every row of it (last axis) holds a 1; ``C`` is 0 where ``B`` is 1 and at
    or below -10000 where it is 0; the mask does not broadcast ``s`` to a larger shape.
Rewrite
    ``softmax(s + C [+ other])``, same softmax axis.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from ..attention_mask import const_eval
from ..padding_mask import HIDDEN
from ..rule import FusionRule, Match, Variant


class MultiplicativeMaskToAdditive(FusionRule):
    name = "MultiplicativeMaskToAdditive"
    kind = "canonical"

    def variants(self) -> List[Variant]:
        out = []
        for b_first in (False, True):  # s · B | B · s
            for c_first in (False, True):  # s · B + C | C + s · B
                for extra in (False, True):  # the masked scores alone under the softmax, or plus another mask
                    s, b, c, other = ~is_const(), wildcard(), wildcard(), wildcard()
                    prod = is_op("relax.multiply")(b, s) if b_first else is_op("relax.multiply")(s, b)
                    sel = is_op("relax.add")(c, prod) if c_first else is_op("relax.add")(prod, c)
                    x = is_op("relax.add")(sel, other) if extra else sel
                    root = is_op("relax.nn.softmax")(x)
                    names = {"s": s, "b": b, "c": c, "sel": sel}
                    if extra:
                        names["other"] = other
                    out.append(Variant(root, names, {"extra": extra}, "relax.nn.softmax"))
        return out

    def check(self, m: Match) -> Optional[str]:
        dtype = str(getattr(m["s"].ty, "dtype", ""))
        if not dtype.startswith("float"):
            return f"the masked scores are {dtype or 'not a tensor'}, not floating point"
        b, c = const_eval(m["b"], m.graph), const_eval(m["c"], m.graph)
        if b is None or c is None:
            return "the factor or the added tensor is not computed from constants"
        if not np.all((b == 0) | (b == 1)):
            return "the factor holds values other than 0 and 1 (not a mask)"
        try:
            shape = np.broadcast_shapes(b.shape, c.shape)
        except ValueError:
            return "the factor and the added tensor do not broadcast together"
        b, c = np.broadcast_to(b, shape).astype(np.float64), np.broadcast_to(c, shape).astype(np.float64)
        if b.ndim == 0 or not np.all(np.any(b == 1, axis=-1)):
            return "a row of the factor keeps no key (the product form would weigh its keys evenly)"
        if np.any(c[b == 1] != 0):
            return "the added tensor is not 0 where the factor keeps a score"
        if np.any(c[b == 0] > HIDDEN):
            return f"the added tensor is above {HIDDEN:g} where the factor drops a score (does not hide the key)"
        if not tvm_ffi.structural_equal(m["s"].ty, m["sel"].ty):
            return "the mask broadcasts the scores to a larger shape"
        return None

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        x = bb.emit(relax.op.add(m.arg("s"), m.arg("c")))
        if m.tag["extra"]:
            x = bb.emit(relax.op.add(x, m.arg("other")))
        return relax.op.nn.softmax(x, axis=int(m.root_value.attrs.axis))
