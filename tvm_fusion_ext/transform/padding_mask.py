"""Which graph input is the padding mask of every fused attention, proven from the mask's computation.

A fused attention's additive mask is some function of the ``attention_mask`` input ``m [B, S]`` (and of
constants and positions): the legacy export's ``(1 - float(m)) · -10000``, the dynamo exporter's
``where(gather_nd(bool(m), [b, j]), 0, finfo.min)``, either plus a causal term. :mod:`.mask_analysis` reads the
computation by what it computes, whatever its spelling: the mask must be ``f(m[b, j])`` with ``m``'s batch on the
mask's batch axis and ``m``'s sequence on the key axis, and ``f`` at ``m = 0`` must be ``<= HIDDEN`` for every
head, query and key (``exp`` of it underflows to exactly 0 next to any real score). That probe is exact where the
mask is known exactly and a bound where positions join it, so it covers every (head, query, key).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
from tvm import relax

from .graph import FunctionGraph, same_dim, shape_dims
from .mask_analysis import MaskAnalysis, MaskRefused, Reads

#: an additive mask at or below this hides a key (BERT's -10000: exp(-1e4) is 0 in any float type)
HIDDEN = -1e4


def _analysis(graph: FunctionGraph) -> MaskAnalysis:
    """One interpretation per graph: the attentions of a model share their mask's computation."""
    cached = getattr(graph, "_mask_analysis", None)
    if cached is None:
        cached = MaskAnalysis(graph)
        try:
            graph._mask_analysis = cached
        except AttributeError:  # a graph that takes no new attributes: interpret again next time
            pass
    return cached


def _reads(graph: FunctionGraph, mask: relax.Expr) -> Reads:
    """The mask read as ``f(m[b, j])``, or :class:`MaskRefused` saying why not."""
    value = _analysis(graph).value(mask)
    if not isinstance(value, Reads):
        raise MaskRefused("the attention mask reads no [batch, seq] input: nothing says which tokens are padding"
                          + (f" (it is computed from {value.why})" if value.why else ""))
    return value


def padding_mask_input(graph: FunctionGraph, masks: List[relax.Expr]) -> Tuple[Optional[relax.Var], Optional[str]]:
    """``(attention_mask parameter, None)`` when every mask in ``masks`` provably hides the keys where that one
    input is 0, else ``(None, reason)``."""
    found = None
    for mask in masks:
        if mask is None:
            return None, "a fused attention has no mask: nothing says which tokens are padding"
        try:
            value = _reads(graph, mask)
        except MaskRefused as e:
            return None, str(e)
        param = value.param
        if found is not None and not param.same_as(found):
            return None, f"fused attentions disagree on the padding mask ('{found.name}' vs '{param.name}')"
        found = param
        dims = shape_dims(param)
        out = shape_dims(mask)
        if out is None or len(out) != 4 or not same_dim(out[0], dims[0]) or not same_dim(out[3], dims[1]):
            return None, (f"the mask from '{param.name}' does not reach the attention as [batch, ·, ·, key] "
                          f"(got {out})")
        if value.flat or value.batch != -4:
            return None, (f"the attention mask's batch axis does not read '{param.name}''s batch "
                          f"(it reads it on axis {value.batch + 4} of {out})")
        with np.errstate(all="ignore"):
            hidden = np.all(np.asarray(value.hi, dtype="float64") <= HIDDEN)
        if not hidden:
            return None, (f"a zero in '{param.name}' does not hide the key (mask value there: up to "
                          f"{float(np.max(np.asarray(value.hi, dtype='float64')))!r} > {HIDDEN}"
                          + (f"; the mask also adds {value.why}" if value.why else "") + ")")
    if found is None:
        return None, "no fused attention"
    return found, None


def key_axis_reason(graph: FunctionGraph, mask: relax.Expr, param: relax.Var) -> Optional[str]:
    """None when ``m`` reaches the additive ``mask`` only along its key axis (constants such as a causal triangle
    may vary over queries); else why not. What the scatter/gather path needs: a padded slot then hides a *key*
    from every query, so the zeros the packed graph scatters there are never read. ``m`` widened along the
    query axis would hide padded queries instead, and the valid queries would read the zeros."""
    try:
        value = _reads(graph, mask)
    except MaskRefused as e:
        return str(e)
    if not value.param.same_as(param):
        return f"the attention mask reads '{value.param.name}', not '{param.name}'"
    if value.flat or value.key != -1:
        dims = shape_dims(mask)
        return (f"the attention mask reads '{param.name}''s sequence on axis {value.key + len(dims or [])} of "
                f"{dims}, off the key axis")
    return None


def key_only_reason(graph: FunctionGraph, mask: relax.Expr, param: relax.Var,
                    uniform_constants: bool = True) -> Optional[str]:
    """None when the additive ``mask`` (one that :func:`padding_mask_input` proved) is ``g(m[b, j])``: the same
    for every head and query, a function of the key's own mask value only; else why not.

    That is what lets the packed attention take the mask as one bias per key (``key_bias``, :mod:`.padding`): a
    constant that varies (a causal triangle, a position bias), positions computed in the graph, or another input
    make ``g`` depend on more than ``m[b, j]``. ``uniform_constants=False`` asks only for ``m`` on the key axis
    (:func:`key_axis_reason`)."""
    reason = key_axis_reason(graph, mask, param)
    if reason is not None or not uniform_constants:
        return reason
    value = _reads(graph, mask)
    if value.why is not None:
        return f"the attention mask also depends on {value.why} (not a key-only mask)"
    return None
