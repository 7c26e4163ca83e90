"""``maximum(s, lowest)`` → ``s``, when ``lowest`` is at or below the dtype's lowest finite value and ``s`` is finite.

XGLM (and other fairseq-derived attentions) clamp the masked scores from below,
``torch.max(scores + mask, finfo.min)``, so that a score pushed past float's range by the mask becomes the
lowest finite value instead of -inf. For a finite ``s`` the clamp is the identity: no finite value lies below
``finfo.min``. The clamp sits between the mask add and the softmax, where the attention matcher expects
nothing, so it is dropped when it cannot change a value.

Pattern
    ``maximum(s, c)`` or ``maximum(c, s)``, ``c`` a scalar constant.
Check
    ``s`` is floating point, ``c <= finfo(s.dtype).min`` (a higher floor is a real clamp), the result keeps
    ``s``'s type (no broadcast), and ``s`` cannot hold -inf or NaN (:func:`~.softmax_nan_guard.may_be_nonfinite`,
    the same finite-activation contract as the NaN guard).
Rewrite
    ``s``.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from ..report import ExpectedRefusal
from ..rule import FusionRule, Match, Variant
from .softmax_nan_guard import may_be_nonfinite


class DropLowestClamp(FusionRule):
    name = "DropLowestClamp"
    kind = "canonical"

    def variants(self) -> List[Variant]:
        out = []
        for swap in (False, True):
            s, c = wildcard(), is_const()
            root = is_op("relax.maximum")(c, s) if swap else is_op("relax.maximum")(s, c)
            out.append(Variant(root, {"s": s, "c": c}))
        return out

    def check(self, m: Match) -> Optional[str]:
        ty = m["s"].ty
        dtype = str(getattr(ty, "dtype", ""))
        if not dtype.startswith("float"):
            # an integer clamp (``max(position, 0)`` in a dynamo export's cache positions) is arithmetic, not the
            # score clamp this rule is about: nothing a user would fix
            return ExpectedRefusal(f"the clamped tensor is {dtype or 'not a tensor'}, not floating point")
        floor = m.scalar("c")
        if floor is None:
            return "the floor is not a scalar constant"
        if floor > float(np.finfo(np.dtype(dtype)).min):
            return f"the floor {floor:g} is above the lowest {dtype} value: a real clamp"
        if not tvm_ffi.structural_equal(m.root_var.ty, ty):
            return "the floor broadcasts the clamped tensor"
        if may_be_nonfinite(m["s"], m.graph):
            return "the clamped tensor may hold -inf or NaN"
        return None

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        return m.arg("s")
