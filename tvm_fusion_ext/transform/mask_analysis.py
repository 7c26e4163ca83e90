"""What an attention mask computes from ``attention_mask``, read by meaning rather than by op sequence.

A small abstract interpretation of the mask's computation. Every tensor on the way is one of

* :class:`Free`: it does not read the ``[batch, seq]`` input: a constant, or something computed from positions
  (``arange``, comparisons of them) or from other inputs, known only by bounds;
* :class:`Reads`: ``value[i] = f_i(m[i_batch, i_key])``: an elementwise function of *one* element of ``m``,
  the one on the value's own batch and key axes. The interpretation tracks those two axes through layout ops
  (unsqueeze, reshape, expand, permute) and gathers (``GatherND`` of ``m[b, j]`` with indices built from
  ``arange``, ``Gather`` at the identity, the legacy flat ``take(m, b·S + j)``).

Both carry bounds ``[lo, hi]`` of their value *at a padded element* (``m = 0``), arrays broadcastable to the
tensor: exact where everything is known (a constant, ``where(m, 0, finfo.min)``), an interval where a free value
joins (a causal term from ``arange`` comparisons), so "padding is hidden" is proven whatever else the mask adds.
``why`` says what makes ``f_i`` depend on the position ``i`` (None: ``f`` is one function of ``m``'s value, the
mask is key-only). An op that reads ``m`` and is none of these is named in the refusal.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Optional

import numpy as np
from tvm import relax

from .flat_index import Affine, _affine_constant, affine_index, is_flat_row_major
from .graph import FunctionGraph, const_value, int_list, op_name, same_dim, shape_dims

_DEPTH = 64

# elementwise binary ops: numpy's exact function (both operands known) and how bounds combine
_EXACT = {
    "relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply, "relax.divide": np.divide,
    "relax.maximum": np.maximum, "relax.minimum": np.minimum, "relax.power": np.power,
    "relax.logical_and": np.logical_and, "relax.logical_or": np.logical_or, "relax.logical_xor": np.logical_xor,
    "relax.bitwise_and": np.bitwise_and, "relax.bitwise_or": np.bitwise_or, "relax.bitwise_xor": np.bitwise_xor,
    "relax.equal": np.equal, "relax.not_equal": np.not_equal, "relax.less": np.less,
    "relax.less_equal": np.less_equal, "relax.greater": np.greater, "relax.greater_equal": np.greater_equal,
}
_UNARY_EXACT = {
    "relax.negative": np.negative, "relax.logical_not": np.logical_not, "relax.bitwise_not": np.invert,
    "relax.isnan": np.isnan, "relax.isinf": np.isinf, "relax.isfinite": np.isfinite, "relax.exp": np.exp,
    "relax.sigmoid": lambda x: 1 / (1 + np.exp(-x)), "relax.tanh": np.tanh, "relax.abs": np.abs,
    "relax.sqrt": np.sqrt, "relax.floor": np.floor, "relax.ceil": np.ceil, "relax.round": np.round,
}
_INCREASING = {"relax.exp", "relax.sigmoid", "relax.tanh", "relax.floor", "relax.ceil", "relax.round"}
_LAYOUT = {"relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.broadcast_to", "relax.permute_dims",
           "relax.strided_slice"}


class MaskRefused(Exception):
    """The proof fails; the message names the op and why."""


@dataclass
class _Value:
    lo: np.ndarray  # bounds at a padded element (m = 0), broadcastable to the tensor (right-aligned)
    hi: np.ndarray
    exact: bool  # lo is hi: the value is known exactly (NaN included)
    why: Optional[str]  # what varies with the position (None: nothing does)


@dataclass
class Free(_Value):
    """A value that does not read ``m``."""


@dataclass
class Reads(_Value):
    """``value[i] = f_i(m[i_batch, i_key])``; ``batch``/``key`` are axes counted from the right (``-1``: last).
    ``flat``: ``m`` flattened row-major into the one axis ``batch == key`` (the legacy ``take`` reads it back)."""

    param: relax.Var = None
    ndim: int = 2
    batch: int = -2
    key: int = -1
    flat: bool = False


def _exact(value: np.ndarray, why: Optional[str] = None) -> Free:
    value = np.asarray(value)
    return Free(value, value, True, why)


def _top(dtype: str, why: str) -> Free:
    """Anything of ``dtype`` (integers: finite, so ``0 · anything`` stays 0)."""
    if dtype == "bool":
        return Free(np.array(False), np.array(True), False, why)
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return Free(np.array(float(info.min)), np.array(float(info.max)), False, why)
    return Free(np.array(-np.inf), np.array(np.inf), False, why)


def _uniform(a: np.ndarray) -> bool:
    flat = np.asarray(a).reshape(-1)
    return flat.size <= 1 or bool(np.all((flat == flat[0]) | (np.isnan(flat) & np.isnan(flat[0])
                                                                if flat.dtype.kind == "f" else False)))


def _join(*whys) -> Optional[str]:
    """Every distinct reason, in order (a refusal then names all that the mask mixes in)."""
    parts = []
    for w in whys:
        for part in (w.split("; ") if w else []):
            if part not in parts:
                parts.append(part)
    return "; ".join(parts[:4]) or None


def _cast(a: np.ndarray, dtype: str, exact: bool) -> np.ndarray:
    """Bounds held in the tensor's own dtype (integers: float64 unless exact, so bounds can be infinite)."""
    if dtype == "bool" or dtype.startswith("float"):
        return np.asarray(a).astype(dtype)
    return np.asarray(a).astype(dtype if exact else "float64")


def _clean(lo: np.ndarray, hi: np.ndarray):
    """An interval that became NaN (``inf - inf``, ``0 · inf``) is unknown there."""
    if lo.dtype.kind == "f" or hi.dtype.kind == "f":
        lo, hi = np.asarray(lo, dtype=np.result_type(lo, np.float32)), np.asarray(hi, np.result_type(hi, np.float32))
        bad = np.isnan(lo) | np.isnan(hi)
        if np.any(bad):
            lo, hi = np.where(bad, -np.inf, lo).astype(lo.dtype), np.where(bad, np.inf, hi).astype(hi.dtype)
    return lo, hi


def _bounds(op: str, a: _Value, b: _Value):
    """Bounds of ``a op b`` from the operands' bounds (an interval extension of each op)."""
    with np.errstate(all="ignore"):
        if op == "relax.add":
            return a.lo + b.lo, a.hi + b.hi
        if op == "relax.subtract":
            return a.lo - b.hi, a.hi - b.lo
        if op in ("relax.multiply", "relax.divide"):
            if op == "relax.divide" and np.any((b.lo <= 0) & (b.hi >= 0)):
                return None
            f = _EXACT[op]
            corners = [f(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
            return np.minimum.reduce(np.broadcast_arrays(*corners)), np.maximum.reduce(np.broadcast_arrays(*corners))
        if op in ("relax.maximum", "relax.minimum", "relax.logical_and", "relax.logical_or", "relax.bitwise_and",
                  "relax.bitwise_or"):
            f = _EXACT[op]  # non-decreasing in both operands (bool: False < True)
            return f(a.lo, b.lo), f(a.hi, b.hi)
        if op in ("relax.less", "relax.less_equal", "relax.greater", "relax.greater_equal"):
            x, y = (a, b) if op in ("relax.less", "relax.less_equal") else (b, a)
            f = np.less if op in ("relax.less", "relax.greater") else np.less_equal
            return f(x.hi, y.lo), f(x.lo, y.hi)
        if op in ("relax.equal", "relax.not_equal"):
            surely = (a.lo == a.hi) & (b.lo == b.hi) & (a.lo == b.lo)
            maybe = (a.lo <= b.hi) & (b.lo <= a.hi)
            return (surely, maybe) if op == "relax.equal" else (~maybe, ~surely)
    return None


class MaskAnalysis:
    """Interprets mask computations of one function (results cached per bound value)."""

    def __init__(self, graph: FunctionGraph):
        self.graph = graph
        self._memo: Dict[relax.Expr, _Value] = {}

    def value(self, e: relax.Expr, depth: int = 0) -> _Value:
        v = self.graph.value(e)
        if v in self._memo:
            return self._memo[v]
        if depth > _DEPTH:
            raise MaskRefused("the attention mask's computation is too deep to prove")
        out = self._eval(v, depth)
        self._memo[v] = out
        return out

    # ------------------------------------------------------------------------------------------------
    def _eval(self, v: relax.Expr, depth: int) -> _Value:
        if isinstance(v, relax.Var):
            dims = shape_dims(v)
            dtype = str(v.ty.dtype) if isinstance(v.ty, relax.TensorType) else ""
            if dims is not None and len(dims) == 2 and dtype:
                zero = np.zeros((), dtype=dtype)
                return Reads(zero, zero, True, None, param=v)
            return _top(dtype or "float32", f"input '{v.name}'")
        const = const_value(v)
        if const is not None:
            return _exact(const, None if _uniform(const) else f"a non-uniform constant {list(const.shape)}")
        op = op_name(v)
        dtype = str(v.ty.dtype) if isinstance(getattr(v, "ty", None), relax.TensorType) else ""

        def arg(i):
            return self.value(v.args[i], depth + 1)

        if op == "relax.where":
            cond = arg(0)
            if cond.exact and isinstance(cond, Free) and (np.all(cond.lo) or not np.any(cond.lo)):
                # a guard with a fixed outcome (``where(broadcast(False), i + n, i)``): the other branch is dead
                picked = arg(1) if bool(np.asarray(cond.lo).reshape(-1)[0]) else arg(2)
                return replace(picked)
            return self._where(v, cond, arg(1), arg(2), dtype)
        if op in _EXACT:
            return self._binary(v, op, arg(0), arg(1), dtype)
        if op in _UNARY_EXACT:
            return self._unary(v, op, arg(0), dtype)
        if op == "relax.astype":
            return self._astype(arg(0), dtype)
        if op in ("relax.zeros", "relax.ones", "relax.zeros_like", "relax.ones_like"):
            return _exact(np.array(1 if "ones" in op else 0, dtype=dtype))
        if op in ("relax.full", "relax.full_like"):
            fill = const_value(self.graph.value(v.args[1]))
            return _exact(fill.astype(dtype)) if fill is not None and fill.size == 1 else _top(dtype, op)
        if op in _LAYOUT:
            return self._layout(v, op, arg(0))
        if op == "relax.take":
            return self._take(v, arg(0))
        if op == "relax.gather_nd":
            return self._gather_nd(v, arg(0))
        # anything else: fine as long as it does not read m (then it is a free value known by its dtype only)
        for a in getattr(v, "args", []):
            if isinstance(getattr(a, "ty", None), relax.TensorType) and isinstance(self.value(a, depth + 1), Reads):
                raise MaskRefused(f"the attention mask is computed with {op or type(v).__name__}: "
                                  "cannot prove what padding does")
        return _top(dtype or "float32", f"values computed with {op or type(v).__name__}")

    # -- elementwise ---------------------------------------------------------------------------------
    def _combine(self, v, op, args: List[_Value], lo, hi, exact, dtype) -> _Value:
        """The result of an elementwise op: :class:`Reads` when an operand reads ``m`` (the same element)."""
        lo, hi = _cast(lo, dtype, exact), _cast(hi, dtype, exact)
        if not exact:
            lo, hi = _clean(lo, hi)
        else:
            hi = lo
        why = _join(*(a.why for a in args))
        reads = [a for a in args if isinstance(a, Reads)]
        if not reads:
            return Free(lo, hi, exact, why)
        first = reads[0]
        ndim = len(shape_dims(v) or []) or first.ndim
        for r in reads[1:]:
            if not r.param.same_as(first.param):
                raise MaskRefused(f"the attention mask combines inputs '{first.param.name}' and '{r.param.name}' "
                                  f"with {op}")
            if (r.batch, r.key, r.flat) != (first.batch, first.key, first.flat):
                raise MaskRefused(f"the attention mask combines '{first.param.name}' read along different axes "
                                  f"with {op}: cannot prove what padding does")
        return Reads(lo, hi, exact, why, param=first.param, ndim=ndim, batch=first.batch, key=first.key,
                     flat=first.flat)

    @staticmethod
    def _one_read(op, args: List[_Value]) -> List[_Value]:
        """Operands reading ``m`` at different places (DeBERTa's ``m[b, q] · m[b, j]``): the read on the key axis
        (the last) is kept; any other becomes a free value, anything of its type, so ``m = 0`` at the key still
        proves what it must for every value at the query."""
        reads = [a for a in args if isinstance(a, Reads)]
        if len({(r.batch, r.key, r.flat) for r in reads}) <= 1:
            return args
        keys = {(r.batch, r.key) for r in reads if r.key == -1 and not r.flat}
        if len(keys) != 1:
            raise MaskRefused(f"the attention mask combines '{reads[0].param.name}' read along different axes "
                              f"with {op}: cannot prove what padding does")
        out = []
        for a in args:
            if isinstance(a, Reads) and (a.key != -1 or a.flat):
                top = _top(str(np.asarray(a.lo).dtype) if a.exact else
                           ("bool" if np.asarray(a.lo).dtype == np.bool_ else "float64"),
                           f"'{a.param.name}' read off the key axis")
                a = top
            out.append(a)
        return out

    def _binary(self, v, op, a: _Value, b: _Value, dtype) -> _Value:
        a, b = self._one_read(op, [a, b])
        if a.exact and b.exact:
            with np.errstate(all="ignore"):
                out = _EXACT[op](a.lo, b.lo)
            return self._combine(v, op, [a, b], out, out, True, dtype)
        bounds = _bounds(op, a, b)
        if bounds is None:
            lo = hi = _top(dtype, op)
            return self._combine(v, op, [a, b], lo.lo, hi.hi, False, dtype)
        return self._combine(v, op, [a, b], bounds[0], bounds[1], False, dtype)

    def _unary(self, v, op, a: _Value, dtype) -> _Value:
        f = _UNARY_EXACT[op]
        with np.errstate(all="ignore"):
            if a.exact:
                out = f(a.lo)
                return self._combine(v, op, [a], out, out, True, dtype)
            if op in _INCREASING:
                return self._combine(v, op, [a], f(a.lo), f(a.hi), False, dtype)
            if op in ("relax.negative", "relax.logical_not", "relax.bitwise_not"):
                return self._combine(v, op, [a], f(a.hi), f(a.lo), False, dtype)
        top = _top(dtype, op)  # isnan of an interval: NaN cannot be excluded
        return self._combine(v, op, [a], top.lo, top.hi, False, dtype)

    def _astype(self, a: _Value, dtype) -> _Value:
        with np.errstate(all="ignore"):
            if a.exact:
                out = np.asarray(a.lo).astype(dtype)
                return replace(a, lo=out, hi=out)
            if dtype == "bool":  # non-zero: not monotone, decided where the interval excludes 0
                lo = (a.lo > 0) | (a.hi < 0)
                hi = (a.lo != 0) | (a.hi != 0)
                return replace(a, lo=lo, hi=hi)
            lo, hi = _clean(np.asarray(a.lo, "float64"), np.asarray(a.hi, "float64"))
            return replace(a, lo=_cast(lo, dtype, False), hi=_cast(hi, dtype, False))

    def _where(self, v, cond: _Value, a: _Value, b: _Value, dtype) -> _Value:
        cond, a, b = self._one_read("relax.where", [cond, a, b])
        with np.errstate(all="ignore"):
            if cond.exact and a.exact and b.exact:
                out = np.where(cond.lo, a.lo, b.lo)
                return self._combine(v, "relax.where", [cond, a, b], out, out, True, dtype)
            lo = np.where(cond.lo, a.lo, np.where(cond.hi, np.minimum(a.lo, b.lo), b.lo))
            hi = np.where(cond.lo, a.hi, np.where(cond.hi, np.maximum(a.hi, b.hi), b.hi))
        return self._combine(v, "relax.where", [cond, a, b], lo, hi, False, dtype)

    # -- layout and gathers --------------------------------------------------------------------------
    def _layout(self, v, op, a: _Value) -> _Value:
        src, out = shape_dims(v.args[0]), shape_dims(v)
        if src is None or out is None:
            if isinstance(a, Reads):
                raise MaskRefused(f"the attention mask's {op} has an unknown shape")
            return _top(str(v.ty.dtype), op)
        lo, hi = self._layout_bounds(v, op, a, src, out)
        why = a.why
        if lo is None:  # a non-uniform bound that this layout op moves: keep only its range
            lo, hi = np.min(a.lo), np.max(a.hi)
            why = why or f"a {op} of a non-uniform value"
            exact = False
        else:
            exact = a.exact
        if exact:
            hi = lo
        if isinstance(a, Free):
            return Free(lo, hi, exact, why)
        return self._layout_reads(v, op, a, src, out, lo, hi, exact, why)

    @staticmethod
    def _layout_bounds(v, op, a: _Value, src, out):
        """The bounds laid out like the tensor, or (None, None) when that cannot be said."""
        def full(x):
            x = np.asarray(x)
            return x.reshape((1,) * (len(src) - x.ndim) + x.shape)

        if np.asarray(a.lo).size <= 1 and np.asarray(a.hi).size <= 1:
            return np.asarray(a.lo).reshape(()), np.asarray(a.hi).reshape(())
        if op == "relax.broadcast_to":  # widens unit axes only: bounds stay broadcastable
            return a.lo, a.hi
        if op == "relax.expand_dims":
            axes = [int(x) % len(out) for x in v.attrs.axis]
            return np.expand_dims(full(a.lo), axes), np.expand_dims(full(a.hi), axes)
        if op == "relax.permute_dims":
            axes = int_list(v.attrs.axes) if v.attrs.axes is not None else list(reversed(range(len(src))))
            return np.transpose(full(a.lo), axes), np.transpose(full(a.hi), axes)
        if all(isinstance(d, int) for d in out) and all(isinstance(d, int) for d in src) and op == "relax.reshape":
            return (np.broadcast_to(a.lo, src).reshape(out), np.broadcast_to(a.hi, src).reshape(out))
        return None, None

    def _layout_reads(self, v, op, a: Reads, src, out, lo, hi, exact, why) -> Reads:
        name = a.param.name
        moved = MaskRefused(f"the attention mask's {op} {src} -> {out} moves '{name}''s batch or key axis")
        rows, cols = shape_dims(a.param)
        if op == "relax.broadcast_to":
            if a.flat or len(out) < len(src):
                raise moved
            return Reads(lo, hi, exact, why, param=a.param, ndim=len(out), batch=a.batch, key=a.key)
        if op == "relax.expand_dims":
            axes = sorted(int(x) % len(out) for x in v.attrs.axis)
            kept = [i for i in range(len(out)) if i not in axes]

            def move(ax):
                return kept[len(src) + ax] - len(out)
            return Reads(lo, hi, exact, why, param=a.param, ndim=len(out), batch=move(a.batch), key=move(a.key),
                         flat=a.flat)
        if op == "relax.permute_dims":
            axes = int_list(v.attrs.axes) if v.attrs.axes is not None else list(reversed(range(len(src))))

            def move(ax):
                return axes.index(ax + len(src)) - len(out)
            return Reads(lo, hi, exact, why, param=a.param, ndim=len(out), batch=move(a.batch), key=move(a.key),
                         flat=a.flat)
        if op == "relax.strided_slice":  # only a slice that keeps everything (``m[:, :]``)
            if len(src) == len(out) and all(same_dim(s, o) for s, o in zip(src, out)):
                return replace(a, lo=lo, hi=hi, exact=exact, why=why)
            raise MaskRefused(f"the attention mask slices '{name}' {src} -> {out}: cannot prove it reads every key")
        # reshape / squeeze: only unit axes come or go, or m is flattened row-major into one axis (or back). A unit
        # batch or sequence (a static batch of 1) has no axis of its own: any unit axis before (after) the other
        # reads it
        def unit(d):
            return isinstance(d, int) and d == 1
        src_core = [i for i, d in enumerate(src) if not unit(d)]
        out_core = [i for i, d in enumerate(out) if not unit(d)]
        if a.flat:
            ok = src_core == [a.batch + len(src)]
        else:
            ok = a.batch < a.key and src_core == [ax + len(src) for ax, n in ((a.batch, rows), (a.key, cols))
                                                  if not unit(n)]
        if not ok:
            raise moved
        wanted = [n for n in (rows, cols) if not unit(n)]
        if len(out_core) == len(wanted) and all(same_dim(out[i], n) for i, n in zip(out_core, wanted)):
            batch = out_core[0] if not unit(rows) else 0
            key = out_core[-1] if not unit(cols) else len(out) - 1
            if batch < key:
                return Reads(lo, hi, exact, why, param=a.param, ndim=len(out), batch=batch - len(out),
                             key=key - len(out))
        if len(wanted) == 2 and len(out_core) == 1 and same_dim(out[out_core[0]], rows * cols):
            ax = out_core[0] - len(out)
            return Reads(lo, hi, exact, why, param=a.param, ndim=len(out), batch=ax, key=ax, flat=True)
        raise moved

    def _take(self, v, a: _Value) -> _Value:
        """``take(x, idx, axis)``: the identity on ``m``'s elements, or the legacy ``take(flat m, b·S + j)``."""
        if isinstance(a, Free):
            return self._gathered_free(v, a)
        data, idx_dims, out = shape_dims(v.args[0]), shape_dims(v.args[1]), shape_dims(v)
        axis = int(v.attrs.axis) if v.attrs.axis is not None else None
        idx = affine_index(v.args[1], self.graph)
        rows, cols = shape_dims(a.param)
        refused = MaskRefused(f"the attention mask gathers '{a.param.name}' (relax.take) at indices other than "
                              "its own positions: cannot prove it reads m[b, j]")
        if data is None or idx_dims is None or out is None or axis is None or np.asarray(a.lo).size > 1:
            raise refused
        axis %= len(data)
        if a.flat:
            if axis != a.batch + len(data) or any(not (isinstance(d, int) and d == 1)
                                                  for i, d in enumerate(data) if i != axis):
                raise refused
            if not is_flat_row_major(idx, idx_dims, rows, cols):
                raise refused
            b_axis = next(i for i, d in enumerate(idx_dims) if same_dim(d, rows))
            j_axis = next(i for i in reversed(range(len(idx_dims))) if same_dim(idx_dims[i], cols))
            trail = len(data) - axis - 1
            return Reads(a.lo, a.hi, a.exact, a.why, param=a.param, ndim=len(out),
                         batch=b_axis - len(idx_dims) - trail, key=j_axis - len(idx_dims) - trail)
        # the identity: a 1-D index that is 0, 1, …, n-1 over the whole axis
        if idx is None or len(idx_dims) != 1 or not same_dim(idx_dims[0], data[axis]) or \
                not _is_coordinate(idx, -1):
            raise refused
        return replace(a, ndim=len(out))

    def _gather_nd(self, v, a: _Value) -> _Value:
        """``gather_nd(m, idx)`` with each index component a coordinate of the output (the dynamo exporter's
        ``m[b, j]`` from broadcast ``arange``s): ``m``'s axes land on those output axes."""
        if isinstance(a, Free):
            return self._gathered_free(v, a)
        data, idx_dims, out = shape_dims(v.args[0]), shape_dims(v.args[1]), shape_dims(v)
        name = a.param.name
        comps = _index_vector(v.args[1], self.graph)
        if int(v.attrs.batch_dims) != 0 or a.flat or data is None or idx_dims is None or out is None or \
                comps is None or np.asarray(a.lo).size > 1:
            raise MaskRefused(f"the attention mask gathers '{name}' with relax.gather_nd at indices this cannot "
                              "read: cannot prove it reads m[b, j]")
        lead = len(idx_dims) - 1
        where = {}  # data axis (positive) -> output axis (positive)
        for d, comp in enumerate(comps):
            axis = _coordinate_axis(comp)
            if axis is None or not same_dim(out[axis], data[d]):
                raise MaskRefused(f"the attention mask gathers '{name}' with relax.gather_nd at indices other than "
                                  f"the positions of its axis {d}: cannot prove it reads m[b, j]")
            where[d] = axis
        for d in range(len(comps), len(data)):
            where[d] = lead + d - len(comps)
        batch, key = where[a.batch + len(data)], where[a.key + len(data)]
        if batch == key:
            raise MaskRefused(f"the attention mask gathers '{name}''s batch and key from one axis (relax.gather_nd)")
        return Reads(a.lo, a.hi, a.exact, a.why, param=a.param, ndim=len(out), batch=batch - len(out),
                     key=key - len(out))

    @staticmethod
    def _gathered_free(v, a: Free) -> Free:
        if _uniform(a.lo) and _uniform(a.hi):
            lo, hi = np.asarray(a.lo).reshape(-1)[:1].reshape(()), np.asarray(a.hi).reshape(-1)[:1].reshape(())
            return Free(lo, lo if a.exact else hi, a.exact, a.why)
        return Free(np.min(a.lo), np.max(a.hi), False, a.why or f"a gather ({op_name(v)}) of a non-uniform value")


def _is_coordinate(idx: Affine, axis: int) -> bool:
    return _coordinate_axis(idx) == idx.ndim + axis


def _coordinate_axis(idx: Affine) -> Optional[int]:
    """The axis (positive) ``a`` when ``idx[i] = i_a``, else None."""
    if _as_int(idx.const) != 0 or len(idx.coef) != 1:
        return None
    (axis, coef), = idx.coef.items()
    return axis + idx.ndim if _as_int(coef) == 1 else None


def _as_int(e) -> Optional[int]:
    if isinstance(e, (int, np.integer)):
        return int(e)
    value = getattr(e, "value", None)
    return int(value) if isinstance(value, (int, np.integer)) else None


def _index_vector(e: relax.Expr, graph: FunctionGraph, depth: int = 0) -> Optional[List[Affine]]:
    """An index tensor ``[..., k]`` as k affine forms over its leading axes (GatherND's indices), or None."""
    if depth > 16:
        return None
    v = graph.value(e)
    dims = shape_dims(v)
    if dims is None or not isinstance(dims[-1], int):
        return None
    const = const_value(v)
    if const is not None:
        comps = [_affine_constant(np.ascontiguousarray(const[..., c])) for c in range(const.shape[-1])]
        return None if any(c is None for c in comps) else comps
    op = op_name(v)
    if op == "relax.where":
        cond = graph.value(v.args[0])
        if op_name(cond) == "relax.broadcast_to":
            cond = graph.value(cond.args[0])
        cond = const_value(cond)
        if cond is None or cond.dtype != np.bool_ or not (np.all(cond) or not np.any(cond)):
            return None
        return _index_vector(v.args[1] if bool(cond.reshape(-1)[0]) else v.args[2], graph, depth + 1)
    if op == "relax.broadcast_to":
        inner = _index_vector(v.args[0], graph, depth + 1)
        return None if inner is None else [Affine(len(dims) - 1, c.coef, c.const) for c in inner]
    if op == "relax.concat" and int(v.attrs.axis) in (-1, len(dims) - 1):
        parts = v.args[0].fields if isinstance(v.args[0], relax.Tuple) else None
        if parts is None:
            return None
        comps = []
        for p in parts:
            pd = shape_dims(p)
            if pd is None or len(pd) != len(dims):
                return None
            if isinstance(pd[-1], int) and pd[-1] == 1:
                a = affine_index(p, graph)
                if a is None:
                    return None
                # the unit last axis carries no index: drop it (axes counted from the right shift by one)
                comps.append(Affine(len(dims) - 1, {k + 1: c for k, c in a.coef.items() if k != -1}, a.const))
            else:
                inner = _index_vector(p, graph, depth + 1)
                if inner is None:
                    return None
                comps += inner
        return comps
    return None
