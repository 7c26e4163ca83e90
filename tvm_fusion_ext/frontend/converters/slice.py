"""ONNX ``Slice`` (opset 10+) of a symbolic dim, or with bounds computed from one, read as an in-range slice.

TVM's converter is exact for constant bounds, but its shapes keep every clamp of the ONNX rule
(``min(INT64_MAX, seq) - min(1, seq)`` for ``x[:, 1:]``), which no later op can prove equal to ``seq - 1``: the
``Add`` that puts the shifted sequence back then has no known shape, and the next ``Shape`` refuses (MobileBERT's
embedding trigram, wav2vec2's positional-conv trim). For bounds computed at run time it assumes them in range and
keeps the end sentinel unclamped: ``alibi[..., -seq:]`` on a table of 128 gets the extent
``seq + INT64_MAX - 128`` (MPT), a shape that is wrong, not just unknown.

Here each bound is normalised as the ONNX rule says (a negative index counts from the end, an end past the dim
is the dim), and the slice is emitted only once it is shown in range, ``0 <= begin <= end <= dim``, so that its
extent is plain ``end - begin``:

    constant bounds  shown over the dims' current ranges, after taking the sliced dim itself as non-empty (a dim
                     computed from the inputs, like a conv's output length, narrows the input's range so that it
                     is: wav2vec2's ``seq // 10 - 1 >= 0`` needs ``seq >= 10``); otherwise TVM's exact converter
    computed bounds  a bound that depends on an input dim is read the way its author meant it, in range: the
                     input dim's range is narrowed until it is (``128 - seq >= 0`` gives ``seq <= 128``), see
                     :meth:`.dims.DimRanges.require`; where no single dim's range can put it in range
                     (``seq - batch``), ONNX's clamps are kept as exact expressions (with ``Select`` for a sign
                     unknown at import), correct for every size, though later ops may not prove them equal to
                     anything

A narrowed range becomes the model's bounds, checked before every call, so an input outside it is refused rather
than read past a table.
"""

from __future__ import annotations

from ..errors import Unsupported
from .common import dim_text, i64, int_elements, is_static

#: an end at or past this is "to the end of the dim" whatever the dim (exporters write INT64_MAX or INT32_MAX)
_PAST_END = 2**31 - 1


def convert_slice_in_range(bb, inputs, ranges, node: str):
    """A ``strided_slice`` for one ONNX Slice node (opset 10+), or None where TVM's converter is right as it is:
    everything static, a step that is not a positive constant with constant bounds, bounds unknown at import."""
    from tvm import relax, tirx

    inputs = list(inputs) + [None] * (5 - len(inputs))
    data = inputs[0]
    if not isinstance(getattr(data, "ty", None), relax.TensorType) or data.ty.shape is None:
        return None
    dims = list(data.ty.shape.values)
    starts, ends = int_elements(bb, inputs[1]), int_elements(bb, inputs[2])
    axes = int_elements(bb, inputs[3]) if inputs[3] is not None else None
    steps = int_elements(bb, inputs[4]) if inputs[4] is not None else None
    if starts is None or ends is None or len(starts) != len(ends):
        return None
    axes = list(range(len(starts))) if axes is None and inputs[3] is None else axes
    steps = [tirx.IntImm("int64", 1)] * len(starts) if steps is None and inputs[4] is None else steps
    if axes is None or steps is None or not all(is_static(x) for x in axes + steps):
        return None
    axes = [int(a) + len(dims) if int(a) < 0 else int(a) for a in axes]
    computed = not all(is_static(x) for x in starts + ends)
    if not computed and all(is_static(dims[a]) for a in axes if 0 <= a < len(dims)):
        return None
    if any(not 0 <= a < len(dims) for a in axes) or len(axes) != len(starts) or len(steps) != len(starts):
        return None  # TVM's converter names the problem
    if any(int(k) <= 0 for k in steps):
        if computed:
            raise Unsupported(f"a slice with a computed bound and step {[int(k) for k in steps]} (only positive "
                              f"steps are read with computed bounds)")
        return None

    saved = ranges.save()
    begins, stops = [], []
    for a, s, e, k in zip(axes, starts, ends, steps):
        d = i64(dims[a])
        why = f"node {node} slices axis {a} ({dim_text(d)}) from {_text(s)} to {_text(e)}"
        b = _index(s, d, ranges, why, computed, is_end=False)
        t = _index(e, d, ranges, why, computed, is_end=True) if b is not None else None
        if t is not None and not _holds(t - b >= 0, d, ranges, why, computed):
            t = None
        if t is None:
            ranges.restore(saved)
            if not computed:
                return None
            # no one dim's range puts it in range (``seq - batch``): ONNX's clamps kept, as exact expressions
            b, t = _clamped(s, d, ranges, is_end=False), _clamped(e, d, ranges, is_end=True)
            t = tirx.max(t, b)
        begins.append(b)
        stops.append(t)
    return relax.op.strided_slice(data, axes, begins, stops, [int(k) for k in steps], assume_inbound=True)


def _clamped(x, d, ranges, is_end: bool):
    """ONNX's reading of ``x`` for any value: from the end when negative, then clamped to ``[0, d]``."""
    from tvm import tirx

    if is_static(x) and int(x) >= _PAST_END:
        return d
    zero = tirx.IntImm("int64", 0)
    v = x if ranges.proves(x >= zero) else x + d if ranges.proves(x < zero) else tirx.Select(x < zero, x + d, x)
    return ranges.simplify(tirx.min(tirx.max(v, zero), d))


def _index(x, d, ranges, why: str, may_narrow: bool, is_end: bool):
    """``x`` as an in-range index into a dim of ``d`` (None when it cannot be shown in range)."""
    from tvm import tirx

    if is_static(x) and int(x) >= _PAST_END:
        return d if is_end else None
    if is_static(x) and is_static(d):
        v, n = int(x), int(d)
        return tirx.IntImm("int64", min(max(v + n if v < 0 else v, 0), n))
    zero = tirx.IntImm("int64", 0)
    if ranges.proves(x >= zero):
        v = x
    elif ranges.proves(x < zero):
        v = x + d
    elif may_narrow and ranges.require(x >= zero, why):
        v = x
    else:
        return None
    v = _unclamped(ranges.simplify(v), ranges, why) if may_narrow else ranges.simplify(v)
    if not (_holds(v >= zero, d, ranges, why, may_narrow) and _holds(d - v >= zero, d, ranges, why, may_narrow)):
        return None
    return ranges.simplify(v)


def _unclamped(v, ranges, why: str):
    """A computed bound's own clamp against a constant, read as not engaging (the in-range reading), with the input's
    range narrowed so that it does not: torch.export writes ``alibi[..., -seq:]``'s start on a table of 128 as
    ``max(128 - seq, 0)``, which is ``128 - seq`` for seq <= 128. Kept as it is where no range can drop it."""
    from tvm import tirx

    while isinstance(v, (tirx.Max, tirx.Min)):
        a, b = (v.b, v.a) if is_static(v.a) else (v.a, v.b)  # a: the computed side, b: the clamp
        if not is_static(b) or not ranges.require(a >= b if isinstance(v, tirx.Max) else a <= b, why):
            return v
        v = ranges.simplify(a)
    return v


def _holds(cond, d, ranges, why: str, may_narrow: bool) -> bool:
    """``cond`` over the ranges; else, for a computed bound, after narrowing one dim's range; else after taking the
    sliced dim as non-empty (which narrows the inputs it is computed from)."""
    from tvm import tirx

    if ranges.proves(cond) or (may_narrow and ranges.require(cond, why)):
        return True
    return not is_static(d) and ranges.require(d >= tirx.IntImm("int64", 1), why) and ranges.proves(cond)


def _text(x) -> str:
    return str(int(x)) if is_static(x) and int(x) < _PAST_END else ("end" if is_static(x) else dim_text(x))
