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

from .flat_index import affine_index, is_flat_row_major
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
            params, layouts = set(), []
            value = _probe(mask, graph, params, layouts, 0)
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
        for check in layouts:
            reason = check(*dims)
            if reason is not None:
                return None, reason
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


def _probe(e: relax.Expr, graph: FunctionGraph, params: set, layouts: list, depth: int) -> np.ndarray:
    """The value of ``e`` with every parameter it reads replaced by a scalar 0 (the padding value).

    Ops that move the mask's elements are checked once the mask's [B, S] is known: ``layouts`` collects the
    checks, each ``check(B, S) -> reason or None``."""
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
        return _probe(v.args[i], graph, params, layouts, depth + 1)

    if op in _LAYOUT_OPS:
        a = arg(0)
        if a.ndim != 0:
            raise _Refused(f"the attention mask lays out a non-uniform tensor with {op}: cannot prove it")
        layouts.append(lambda rows, cols, call=v: _layout_error(call, rows, cols))
        return a
    if op == "relax.take":
        a = arg(0)
        if a.ndim != 0:
            raise _Refused("the attention mask gathers a non-uniform tensor: cannot prove it")
        idx = affine_index(v.args[1], graph)
        layouts.append(lambda rows, cols, call=v, idx=idx: _gather_error(call, idx, rows, cols))
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


def _core(dims) -> list:
    return [d for d in dims if not (isinstance(d, int) and d == 1)]


def _is_mask_layout(dims, rows, cols) -> bool:
    """Non-unit axes ``[B, S]`` (in this order) or ``[B·S]``: ``m``'s elements in row-major order."""
    core = _core(dims)
    if len(core) == 2:
        return same_dim(core[0], rows) and same_dim(core[1], cols)
    return len(core) == 1 and same_dim(core[0], rows * cols)


def _layout_error(call: relax.Call, rows, cols) -> Optional[str]:
    """A layout op on the mask keeps ``m``'s elements in order; broadcast_to only widens unit axes."""
    src, out = shape_dims(call.args[0]), shape_dims(call)
    op = op_name(call)
    if src is None or out is None:
        return f"the attention mask's {op} has an unknown shape"
    if op == "relax.broadcast_to":
        ok = len(out) == len(src) and _is_mask_layout(src, rows, cols) and all(
            (isinstance(s, int) and s == 1) or same_dim(s, o) for s, o in zip(src, out))
    else:
        ok = _is_mask_layout(src, rows, cols) and _is_mask_layout(out, rows, cols)
    return None if ok else f"the attention mask's {op} {src} -> {out} moves the batch or key axis"


def _gather_error(call: relax.Call, idx, rows, cols) -> Optional[str]:
    """``take(flat m, b·S + j)``: the dynamic exports' GatherND of the mask, the identity on its elements."""
    data = shape_dims(call.args[0])
    if (int(call.attrs.axis) if call.attrs.axis is not None else None) != 0 or data is None or \
            not same_dim(data[0], rows * cols) or _core(data[1:]):
        return f"the attention mask is gathered from a {data} tensor: cannot prove it reads m[b, j]"
    if not is_flat_row_major(idx, shape_dims(call.args[1]), rows, cols):
        return "the attention mask is gathered at indices other than b·S + j: cannot prove it reads m[b, j]"
    return None


def key_axis_reason(graph: FunctionGraph, mask: relax.Expr, param: relax.Var) -> Optional[str]:
    """None when ``m`` reaches the additive ``mask`` only along its key axis (constants such as a causal triangle
    may vary over queries); else why not. What the scatter/gather path needs: a padded slot then hides a *key*
    from every query, so the zeros the packed graph scatters there are never read. ``m`` widened along the
    query axis would hide padded queries instead, and the valid queries would read the zeros."""
    return key_only_reason(graph, mask, param, uniform_constants=False)


def key_only_reason(graph: FunctionGraph, mask: relax.Expr, param: relax.Var,
                    uniform_constants: bool = True) -> Optional[str]:
    """None when the additive ``mask`` (one that :func:`padding_mask_input` proved) is ``g(m[b, j])``: the same
    for every head and query, a function of the key's own mask value only; else why not.

    That is what lets the packed attention take the mask as one bias per key (``key_bias``, :mod:`.padding`).
    Given the proof's layout checks (``m``'s elements stay in order), it holds when every constant the mask reads
    is uniform (a causal triangle or a position bias is not) and wherever a tensor computed from ``m`` is
    broadcast (``broadcast_to``, an elementwise op with a wider operand), ``m``'s sequence axis is its last axis,
    the key axis (``[B, 1, S, 1]`` widened over keys would be a query mask)."""
    _, seq = shape_dims(param)
    todo, seen = [mask], []
    while todo:
        e = graph.value(todo.pop())
        if any(e.same_as(s) for s in seen):
            continue
        seen.append(e)
        const = const_value(e)
        if const is not None:
            if uniform_constants and const.size and not np.all(const == const.reshape(-1)[0]):
                return f"the attention mask adds a non-uniform constant {list(const.shape)} (not a key-only mask)"
            continue
        if isinstance(e, relax.Var):
            continue
        op = op_name(e)
        args = [a for a in ([e.args[0]] if op in _LAYOUT_OPS or op == "relax.take" else e.args)
                if isinstance(getattr(a, "ty", None), relax.TensorType)]
        out = shape_dims(e)
        for a in args:
            dims = shape_dims(a)
            widened = op not in ("relax.reshape", "relax.expand_dims", "relax.take") and not (
                dims is not None and out is not None and len(dims) == len(out)
                and all(same_dim(x, y) for x, y in zip(dims, out)))
            if widened and const_value(graph.value(a)) is None and not _sequence_is_last(dims, seq):
                return (f"the attention mask widens {dims} to {out} with '{param.name}''s sequence axis off the "
                        "key axis")
        todo += args
    return None


def _sequence_is_last(dims, seq) -> bool:
    """The last non-unit axis of ``dims`` is the sequence, and nothing follows it."""
    if dims is None:
        return False
    core = [n for n, d in enumerate(dims) if not (isinstance(d, int) and d == 1)]
    return bool(core) and core[-1] == len(dims) - 1 and same_dim(dims[-1], seq)
