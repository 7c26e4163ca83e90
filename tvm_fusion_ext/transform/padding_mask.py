"""Which graph input is the padding mask of every fused attention, proven from the mask's computation.

A fused attention's additive mask is some elementwise function ``f`` of the ``attention_mask`` input
``m [B, S]`` (and of constants), laid out so that ``m[b, j]`` lands on batch ``b`` and key ``j``: the legacy
export's ``(1 - float(m)) · -10000``, SDPA's ``where(bool(m), 0, -inf)``, either plus a causal constant. Padding
can be removed only if a position with ``m == 0`` is hidden as a key from every query: ``f`` evaluated with
``m ≡ 0`` must be ``<= HIDDEN`` everywhere (``exp`` of it underflows to exactly 0 next to any real score). That
probe is exact, not a sample: with ``m`` a scalar 0 every constant keeps its own shape, so the probe covers every
(head, query, key) the constants distinguish.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
from tvm import relax

from .graph import FunctionGraph, const_value, op_name, same_dim, shape_dims

#: an additive mask at or below this hides a key (BERT's -10000: exp(-1e4) is 0 in any float type)
HIDDEN = -1e4

_DEPTH = 24

# ops that only lay the mask out (insert unit axes, broadcast): checked by the shape of their result
_LAYOUT_OPS = {"relax.reshape", "relax.expand_dims", "relax.broadcast_to"}

_NUMPY = {
    "relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply, "relax.divide": np.divide,
    "relax.maximum": np.maximum, "relax.minimum": np.minimum, "relax.logical_and": np.logical_and,
    "relax.logical_or": np.logical_or, "relax.equal": np.equal, "relax.not_equal": np.not_equal,
    "relax.less": np.less, "relax.less_equal": np.less_equal, "relax.greater": np.greater,
    "relax.greater_equal": np.greater_equal,
}


class _Refused(Exception):
    pass


def padding_mask_input(graph: FunctionGraph, masks: List[relax.Expr]) -> Tuple[Optional[relax.Var], Optional[str]]:
    """``(attention_mask parameter, None)`` when every mask in ``masks`` provably hides the keys where that one
    input is 0, else ``(None, reason)``."""
    found = None
    for mask in masks:
        if mask is None:
            return None, "a fused attention has no mask: nothing says which tokens are padding"
        try:
            params = set()
            value = _probe(mask, graph, params, 0)
        except _Refused as e:
            return None, str(e)
        if len(params) != 1:
            return None, (f"the attention mask depends on {len(params)} inputs "
                          f"({', '.join(sorted(p.name for p in params)) or 'none'}), expected one attention_mask")
        param = params.pop()
        if found is not None and not param.same_as(found):
            return None, f"fused attentions disagree on the padding mask ('{found.name}' vs '{param.name}')"
        found = param
        dims = shape_dims(param)
        if dims is None or len(dims) != 2:
            return None, f"input '{param.name}' is not a [batch, seq] mask"
        out = shape_dims(mask)
        if out is None or len(out) != 4 or not same_dim(out[0], dims[0]) or not same_dim(out[3], dims[1]):
            return None, (f"the mask from '{param.name}' does not reach the attention as [batch, ·, ·, key] "
                          f"(got {out})")
        with np.errstate(all="ignore"):
            hidden = np.all(np.asarray(value, dtype="float64") <= HIDDEN)
        if not hidden:
            return None, (f"a zero in '{param.name}' does not hide the key (mask value there: "
                          f"{np.max(value)!r} > {HIDDEN})")
    if found is None:
        return None, "no fused attention"
    return found, None


def _probe(e: relax.Expr, graph: FunctionGraph, params: set, depth: int) -> np.ndarray:
    """The value of ``e`` with every parameter it reads replaced by a scalar 0 (the padding value)."""
    if depth > _DEPTH:
        raise _Refused("the attention mask's computation is too deep to prove")
    v = graph.value(e)
    if isinstance(v, relax.Var):
        dims = shape_dims(v)
        if dims is None or len(dims) != 2:
            raise _Refused(f"the attention mask reads '{v.name}', not a [batch, seq] input")
        params.add(v)
        return np.zeros((), dtype=str(v.ty.dtype))
    const = const_value(v)
    if const is not None:
        return const
    op = op_name(v)

    def arg(i):
        return _probe(v.args[i], graph, params, depth + 1)

    if op in _LAYOUT_OPS:
        a = arg(0)
        if a.ndim != 0:
            raise _Refused(f"the attention mask lays out a non-uniform tensor with {op}: cannot prove it")
        _check_layout(v, graph)
        return a
    if op == "relax.astype":
        return arg(0).astype(str(v.attrs.dtype))
    if op == "relax.where":
        return np.where(arg(0), arg(1), arg(2))
    if op == "relax.negative":
        return np.negative(arg(0))
    if op == "relax.logical_not":
        return np.logical_not(arg(0))
    if op in _NUMPY:
        with np.errstate(all="ignore"):
            return _NUMPY[op](arg(0), arg(1))
    raise _Refused(f"the attention mask is computed with {op or type(v).__name__}: cannot prove what padding does")


def _check_layout(call: relax.Call, graph: FunctionGraph) -> None:
    """A layout op on the mask keeps batch first and the sequence last (only unit axes are inserted between)."""
    src, out = shape_dims(call.args[0]), shape_dims(call)
    if src is None or out is None:
        raise _Refused(f"the attention mask's {op_name(call)} has an unknown shape")
    core_src = [d for d in src if not (isinstance(d, int) and d == 1)]
    core_out = [d for d in out if not (isinstance(d, int) and d == 1)]
    if op_name(call) == "relax.broadcast_to":
        ok = len(out) == len(src) and all(
            (isinstance(s, int) and s == 1) or same_dim(s, o) for s, o in zip(src, out))
        ok = ok and same_dim(out[0], src[0]) and same_dim(out[-1], src[-1])
    else:
        ok = (len(core_src) == len(core_out) and all(same_dim(a, b) for a, b in zip(core_src, core_out))
              and same_dim(out[-1], src[-1]) and same_dim(out[0], src[0]))
    if not ok:
        raise _Refused(f"the attention mask's {op_name(call)} {src} -> {out} moves the batch or key axis")
