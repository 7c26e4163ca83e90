"""A model's input dims: which are static, which are symbolic (one TIR variable per ONNX ``dim_param``), and the
bounds of the symbolic ones.

An ONNX input dim is static (``dim_value > 0``), named (``dim_param``, e.g. ``batch``/``sequence``; inputs that
share a name share the variable, so ``input_ids`` and ``attention_mask`` agree on their length), or unnamed
(its own variable, ``<input>_dim<k>``). ``shapes=`` pins dims to sizes (a static build); whatever stays open is
symbolic.

Every symbolic dim gets an upper bound, stored on ``main`` as TVM's ``tir_var_upper_bound`` attribute (memory
planning then allocates every intermediate once, at its largest size) and checked before each call. Bounds
come from ``max_shapes=`` when given; otherwise from the graph itself where it shows one (a dim used as the
end of a slice of a constant table, or as the length of positions gathered from a constant table: the
position-embedding table bounds the sequence); otherwise a dim that is the leading axis of an input is taken
for a batch (``DEFAULT_BATCH_BOUND``) and any other for a sequence (``DEFAULT_SEQ_BOUND``).

A decoder with a KV cache gathers the positions after its cache, ``past .. past + new - 1`` (GPT-2's learned
positions): a table of ``n`` rows then bounds ``past <= n - 1`` and ``new <= n``, and every other sequence dim
without a bound of its own (the mask's ``past + new``) ``<= n``, instead of the default. A past length's range
starts at 0 (:func:`past_length_dims`: the first generation step feeds an empty cache); every other at 1.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Dict, List, Optional, Tuple

from .errors import InputError, ModelLoadError

#: TVM's own function attribute for symbolic-dim upper bounds (read by Relax memory planning)
BOUND_ATTR = "tir_var_upper_bound"
#: TVM's function attribute for symbolic-dim lower bounds above 1 (ours set one only where a slice needs it)
LOWER_BOUND_ATTR = "tir_var_lower_bound"
#: TVM's function attribute listing symbolic dims known to be non-negative
NON_NEGATIVE_ATTR = "tir_non_negative_var"
#: ours: ``{dim name: {"upper": why, "lower": why}}``, where each bound came from (manifest and ``compile`` show it)
BOUND_REASONS_ATTR = "tfx_bound_reasons"
DEFAULT_BATCH_BOUND = 64
DEFAULT_SEQ_BOUND = 512
#: why a past length's range starts at 0 (manifest, ``info`` and range errors quote it)
PAST_MAY_BE_EMPTY = "a past (KV cache) length: 0 on the first generation step"


def past_length_dims(graph_inputs) -> set:
    """Names of the symbolic dims that may be 0: those that measure only past (KV cache) inputs, a floating
    input named ``*past*`` of rank >= 3 at an axis after the batch, and appear in no other input. Optimum's
    runtime and ONNX Runtime GenAI feed such a past of length 0 on a generation's first call; every other dim
    starts at 1."""
    past, elsewhere = set(), set()
    for vi in graph_inputs:
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        floating = tt.elem_type in (1, 10, 11, 16)  # FLOAT, FLOAT16, DOUBLE, BFLOAT16
        is_past = floating and "past" in vi.name.lower() and len(tt.shape.dim) >= 3
        for axis in range(len(tt.shape.dim)):
            dim = _dim_at(vi, axis)
            if dim is not None:
                (past if is_past and axis > 0 else elsewhere).add(dim)
    return past - elsewhere


def expand_input_patterns(spec: Optional[Mapping[str, Sequence[int]]], known: Sequence[str], label: str,
                          what: str) -> Dict[str, Sequence[int]]:
    """``spec`` (input name → dims) with each shell-style pattern (``past_key_values.*``: a decoder has two per
    layer) replaced by every input it matches; a name given exactly wins over a pattern that also matches it. A
    pattern that matches nothing is one line naming the inputs."""
    import fnmatch

    out: Dict[str, Sequence[int]] = {}
    for name, dims in (spec or {}).items():
        if not any(c in name for c in "*?["):
            continue
        matched = fnmatch.filter(known, name)
        if not matched:
            raise InputError(f"{label}: {what} pattern {name!r} matches no input; model inputs are: "
                             f"{', '.join(known)}")
        out.update({m: dims for m in matched})
    out.update({name: dims for name, dims in (spec or {}).items() if not any(c in name for c in "*?[")})
    return out


def input_dims(graph_inputs, shapes: Optional[Mapping[str, Sequence[int]]], label: str):
    """``({input: [int | tirx.Var per dim]}, {dim name: tirx.Var})`` for the importer; pinned dims from ``shapes``
    (input names or patterns, :func:`expand_input_patterns`)."""
    from tvm import tirx

    known = [i.name for i in graph_inputs]
    shapes = expand_input_patterns(shapes, known, label, "shapes")
    empty_ok = past_length_dims(graph_inputs)  # a past length may be pinned to 0 (the first generation step)
    for name in shapes:
        if name not in known:
            raise InputError(f"{label}: shapes names unknown input {name!r}; model inputs are: {', '.join(known)}")
    pinned = _pinned_dim_names(graph_inputs, shapes, label)
    out: Dict[str, list] = {}
    dim_vars: Dict[str, tirx.Var] = {}
    for vi in graph_inputs:
        name = vi.name
        if name in shapes and _rank_unknown(vi, label):
            out[name] = [_as_dim(d, name, label) for d in shapes[name]]  # shapes= is what gives it a rank
            continue
        declared = declared_dims(vi, label)
        if name in shapes:
            given = [_as_dim(d, name, label, zero_ok=_dim_at(vi, k) in empty_ok) for k, d in enumerate(shapes[name])]
            if len(given) != len(declared):
                raise InputError(f"{label}: shape {given} for input {name!r} has rank {len(given)} but the "
                                 f"model declares rank {len(declared)} {declared}")
            for k, (g, d) in enumerate(zip(given, declared)):
                if isinstance(d, int) and g != d:
                    # Static exports bake sizes into Reshape constants: a different size cannot work.
                    raise InputError(f"{label}: input {name!r} dim {k} is fixed to {d} in the model; "
                                     f"shapes gives {g}")
            out[name] = given
            continue
        dims = []
        for k, d in enumerate(declared):
            if isinstance(d, int):
                dims.append(d)
                continue
            if d in pinned:   # a dim another input's pinned shape gives (the model names both alike)
                dims.append(pinned[d])
                continue
            dim_name = _identifier(d if d != "?" else f"{name}_dim{k}")
            dims.append(dim_vars.setdefault(dim_name, tirx.Var(dim_name, "int64")))
        out[name] = dims
    return out, dim_vars


def _pinned_dim_names(graph_inputs, shapes: Mapping[str, Sequence[int]], label: str) -> Dict[str, int]:
    """``{dim name: size}`` for the named dynamic dims that ``shapes`` pins: the model says by the name that other
    inputs have the same size there (``input_ids`` pinned to 1 × 128 pins ``attention_mask``'s ``batch, seq``
    too; left symbolic, the two would disagree inside the graph). Two pins of one name must agree."""
    pinned: Dict[str, int] = {}
    source: Dict[str, str] = {}
    for vi in graph_inputs:
        if vi.name not in shapes or _rank_unknown(vi, label):
            continue
        declared = declared_dims(vi, label)
        if len(declared) != len(shapes[vi.name]):
            continue   # refused with the rank in input_dims
        for d, g in zip(declared, shapes[vi.name]):
            if isinstance(d, int) or d == "?":
                continue
            g = int(g)
            if d in pinned and pinned[d] != g:
                raise InputError(f"{label}: inputs {source[d]!r} and {vi.name!r} share the dim {d!r}, but shapes "
                                 f"gives {pinned[d]} and {g}")
            pinned.setdefault(d, g)
            source.setdefault(d, vi.name)
    return pinned


def _rank_unknown(vi, label: str) -> bool:
    if not vi.type.HasField("tensor_type"):
        raise ModelLoadError(f"{label}: input {vi.name!r} is not a tensor (only tensor inputs are supported)")
    return not vi.type.tensor_type.HasField("shape")


def declared_dims(vi, label: str) -> List:
    """The input's dims as the model declares them: ints, ``dim_param`` names, or "?" for unnamed dynamic dims."""
    if not vi.type.HasField("tensor_type"):
        raise ModelLoadError(f"{label}: input {vi.name!r} is not a tensor (only tensor inputs are supported)")
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        raise ModelLoadError(f"{label}: input {vi.name!r} has unknown rank; pass shapes=... "
                             f"e.g. {{{vi.name!r}: [1, 128]}}")
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
            for d in tt.shape.dim]


def infer_bounds(mod, dim_vars: dict, graph_inputs, max_shapes: Optional[Mapping[str, Sequence[int]]],
                 label: str, ranges: Optional["DimRanges"] = None) -> Tuple[Dict[str, int], Dict[str, Dict[str, str]]]:
    """An upper bound for every symbolic dim (see the module docstring for where each comes from), no wider than
    the ranges the importer narrowed (``ranges``); a bound ``max_shapes`` gives wider than that is refused.
    Returns ``(bounds, reasons)``: ``reasons[name]["upper"]`` says where the bound came from, ``["lower"]`` what
    raised a lower bound above 1 (a user who finds ``seq <= 128`` in a manifest can tell a default from a limit
    the model itself sets)."""
    given = given_bounds(dim_vars, graph_inputs, max_shapes, label)
    cache = {}  # a cache's positions gathered from a table: past + new (the mask's length) <= its rows
    seen = _graph_bounds(mod["main"], dim_vars, ranges.start if ranges is not None else None, cache)
    narrowed = ranges.narrowed_upper() if ranges is not None else {}
    leading = {_dim_at(vi, 0) for vi in graph_inputs}
    bounds: Dict[str, int] = {}
    reasons: Dict[str, Dict[str, str]] = {}
    for name in dim_vars:
        if name in given:
            bounds[name], why = given[name], "given (--max-shape)"
        elif name in seen:
            bounds[name], why = seen[name]
            if name in narrowed and narrowed[name] <= bounds[name]:  # the importer's reason names the node
                bounds[name], why = narrowed[name], ranges.reasons[name]["upper"]
        elif name in leading:
            bounds[name], why = DEFAULT_BATCH_BOUND, "default for a leading (batch) dim; --max-shape sets one"
        elif "total" in cache:  # a decoder whose positions after its cache the graph bounds: every other
            bounds[name], why = cache["total"]  # sequence dim (the mask's past + new) spans at most that many
        else:
            bounds[name], why = DEFAULT_SEQ_BOUND, "default for a sequence dim; --max-shape sets one"
        if name in narrowed and bounds[name] > narrowed[name]:
            if name in given:
                raise InputError(f"{label}: max shapes give {name} <= {given[name]}, but the model only reads "
                                 f"{name} <= {narrowed[name]} in range ({ranges.reasons[name]['upper']})")
            bounds[name], why = narrowed[name], ranges.reasons[name]["upper"]  # what the graph needs
        reasons[name] = {"upper": why}
    if ranges is not None:
        for name, low in ranges.lower_bounds().items():
            if low == 0:
                reasons[name]["lower"] = PAST_MAY_BE_EMPTY
        for name, low in ranges.narrowed_lower().items():
            if low > bounds[name]:
                raise ModelLoadError(f"{label}: no {name} fits the model: {ranges.reasons[name]['lower']} needs "
                                     f"{name} >= {low}, and {name} <= {bounds[name]}")
            reasons[name]["lower"] = ranges.reasons[name]["lower"]
    return bounds, reasons


def shape_bounds(mod) -> Dict[str, Tuple[int, int]]:
    """``{dim name: (lower, upper)}`` of a module's symbolic input dims (empty for a static module); the lower
    bound is 1 unless the importer narrowed it (:class:`DimRanges`), or 0 for a past length left open."""
    attrs = mod["main"].attrs
    if attrs is None or BOUND_ATTR not in attrs:
        return {}
    lower = attrs[LOWER_BOUND_ATTR] if LOWER_BOUND_ATTR in attrs else {}
    return {str(k): (int(lower[k]) if k in lower else 1, int(v)) for k, v in attrs[BOUND_ATTR].items()}


def with_bounds(func, bounds: Dict[str, int], lower: Optional[Dict[str, int]] = None,
                reasons: Optional[Dict[str, Dict[str, str]]] = None):
    """``func`` with the bound attributes set (TVM reads them; so do our loaders), and why each bound is what it
    is when ``reasons`` (from :func:`infer_bounds`) is given."""
    if not bounds:
        return func
    attrs = {BOUND_ATTR: {k: int(v) for k, v in bounds.items()}, NON_NEGATIVE_ATTR: sorted(bounds)}
    if lower:
        attrs[LOWER_BOUND_ATTR] = {k: int(v) for k, v in lower.items()}
    if reasons:
        attrs[BOUND_REASONS_ATTR] = {k: dict(v) for k, v in reasons.items()}
    return func.with_attrs(attrs)


def bound_reasons(mod) -> Dict[str, Dict[str, str]]:
    """``{dim name: {"upper": why, "lower": why}}`` as :func:`infer_bounds` gave them (empty for a module not
    imported by :func:`~tvm_fusion_ext.frontend.load_onnx`)."""
    attrs = mod["main"].attrs
    if attrs is None or BOUND_REASONS_ATTR not in attrs:
        return {}
    return {str(k): {str(side): str(why) for side, why in v.items()} for k, v in attrs[BOUND_REASONS_ATTR].items()}


class DimRanges:
    """The range ``[lower, upper]`` of each symbolic input dim while a model is imported.

    Every dim starts at ``[1, upper]`` (``upper`` from ``max_shapes`` when given, else open). An importer that can
    only read an op one way for part of that range (a slice whose start ``128 - seq`` is only a start while
    ``seq <= 128``; a conv trim ``[:-1]`` only meaningful once the conv gives an output) narrows it here with
    :meth:`require`, and the narrowed range becomes the model's bounds, checked before every call: an input outside
    it is refused in one line instead of reading past a table. Why each bound was narrowed is kept for errors."""

    OPEN = 1 << 40  # an upper bound no real input reaches, so an unbounded dim has a finite range to reason in

    def __init__(self, dim_vars: Mapping, upper: Optional[Mapping[str, int]] = None, may_be_empty=()):
        self.vars = dict(dim_vars)
        #: where each range starts: 1, or 0 for a past length (:func:`past_length_dims`)
        self.start = {name: 0 if name in may_be_empty else 1 for name in self.vars}
        self.lower = dict(self.start)
        self.upper = {name: int((upper or {}).get(name, self.OPEN)) for name in self.vars}
        #: ``{dim name: (side "lower"/"upper", what needed it)}`` for each range :meth:`require` narrowed
        self.reasons: Dict[str, Dict[str, str]] = {}

    def proves(self, cond, ranges: Optional[Mapping[str, Tuple[int, int]]] = None) -> bool:
        """Whether ``cond`` holds over the current ranges (or over ``ranges`` for the dims it names)."""
        return bool(self._analyzer(ranges).can_prove(cond))

    def simplify(self, expr):
        """``expr`` simplified over the current ranges (``max(1 - seq, 0)`` is 0 once seq >= 1)."""
        return self._analyzer().simplify(expr)

    def _analyzer(self, ranges: Optional[Mapping[str, Tuple[int, int]]] = None):
        from tvm import sym

        ana = sym.Analyzer()
        for name, var in self.vars.items():
            low, high = (ranges or {}).get(name, (self.lower[name], self.upper[name]))
            ana.update(var, sym.ConstIntBound(int(low), int(high)), override=True)
        return ana

    def require(self, cond, why: str) -> bool:
        """Make ``cond`` hold: True when it already does, or after narrowing the range of the one dim it depends
        on (whichever side keeps more of the range); False, with nothing narrowed, when neither side can."""
        if self.proves(cond):
            return True
        names = [n for n in _free_var_names(cond) if n in self.vars]
        if len(names) != 1 or len(_free_var_names(cond)) != 1:
            return False
        name = names[0]
        low, high = self.lower[name], self.upper[name]

        def holds(a, b):
            return self.proves(cond, {name: (a, b)})

        choices = []
        if holds(low, low):  # the largest upper bound that keeps cond (bisection: provable at a, not at b)
            a, b = low, high
            while b - a > 1:
                m = (a + b) // 2
                a, b = (m, b) if holds(low, m) else (a, m)
            choices.append((a - low, "upper", a))
        if holds(high, high):  # the smallest lower bound that keeps cond
            a, b = low, high
            while b - a > 1:
                m = (a + b) // 2
                a, b = (a, m) if holds(m, high) else (m, b)
            choices.append((high - b, "lower", b))
        if not choices:
            return False
        _, side, value = max(choices)
        if side == "upper":
            self.upper[name] = value
        else:
            self.lower[name] = value
        self.reasons.setdefault(name, {})[side] = why
        return True

    def save(self):
        """The current ranges, for :meth:`restore` when what narrowed them is given up."""
        return dict(self.lower), dict(self.upper), {n: dict(r) for n, r in self.reasons.items()}

    def restore(self, saved) -> None:
        self.lower, self.upper, self.reasons = (dict(x) for x in saved)

    def narrowed_upper(self) -> Dict[str, int]:
        """The upper bounds :meth:`require` set (dims left open are absent)."""
        return {n: u for n, u in self.upper.items() if u < self.OPEN and "upper" in self.reasons.get(n, {})}

    def narrowed_lower(self) -> Dict[str, int]:
        """The lower bounds :meth:`require` raised above where the range starts (1, or 0 for a past length)."""
        return {n: low for n, low in self.lower.items() if low > self.start[n]}

    def lower_bounds(self) -> Dict[str, int]:
        """Every lower bound other than 1 (the model's ``tir_var_lower_bound``): narrowed ones, and the 0 of a past
        length left open."""
        return {n: low for n, low in self.lower.items() if low != 1}


# ---------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------

def _free_var_names(expr) -> set:
    from tvm import tirx

    return {str(v.name) for v in tirx.analysis.undefined_vars(expr)}


def _identifier(text: str) -> str:
    name = re.sub(r"\W", "_", str(text)).strip("_") or "dim"
    return name if not name[0].isdigit() else f"d_{name}"


def _dim_at(vi, axis: int) -> Optional[str]:
    dims = vi.type.tensor_type.shape.dim
    if len(dims) <= axis:
        return None
    d = dims[axis]
    if d.HasField("dim_value") and d.dim_value > 0:
        return None
    return _identifier(d.dim_param or f"{vi.name}_dim{axis}")


def _as_dim(d, name, label, zero_ok: bool = False) -> int:
    try:
        v = int(d)
    except (TypeError, ValueError):
        raise InputError(f"{label}: shape of input {name!r} has non-integer dimension {d!r}") from None
    if v == 0 and zero_ok and v == d:
        return 0
    if v <= 0 or v != d:
        raise InputError(f"{label}: shape of input {name!r} has invalid dimension {d!r} (must be a positive integer; "
                         f"only a past (KV cache) length may be 0)")
    return v


def given_bounds(dim_vars, graph_inputs, max_shapes, label) -> Dict[str, int]:
    """``{dim name: upper bound}`` from ``max_shapes`` (by ONNX input name or pattern), checked against the declared
    dims."""
    out: Dict[str, int] = {}
    if not max_shapes:
        return out
    by_name = {vi.name: vi for vi in graph_inputs}
    max_shapes = expand_input_patterns(max_shapes, list(by_name), label, "max shapes")
    for name, dims in max_shapes.items():
        if name not in by_name:
            raise InputError(f"{label}: max shapes name unknown input {name!r}; model inputs are: "
                             f"{', '.join(by_name)}")
        declared = declared_dims(by_name[name], label)
        if len(dims) != len(declared):
            raise InputError(f"{label}: max shape {list(dims)} for input {name!r} has rank {len(dims)}, the model's "
                             f"is {len(declared)}")
        for k, (bound, d) in enumerate(zip(dims, declared)):
            bound = _as_dim(bound, name, label)
            if isinstance(d, int):
                if bound != d:
                    raise InputError(f"{label}: input {name!r} dim {k} is fixed to {d}; max shape gives {bound}")
                continue
            dim = _dim_at(by_name[name], k)
            if dim not in dim_vars:
                continue  # pinned by shapes=
            if out.get(dim, bound) != bound:
                raise InputError(f"{label}: max shapes give dim {dim!r} two bounds ({out[dim]} and {bound})")
            out[dim] = bound
    return out


def _graph_bounds(func, dim_vars, lower: Optional[Mapping[str, int]] = None,
                  cache_positions: Optional[dict] = None) -> Dict[str, Tuple[int, str]]:
    """Bounds the graph itself implies, ``{dim: (bound, why)}``: ``strided_slice(constant, end=dim)`` along an axis
    of n → dim ≤ n; ``take(constant, indices)`` along an axis of n, with indices whose largest value is exactly
    ``dim + c - 1`` (positions ``arange(0, dim)``, shifted or broadcast, as GPT-2, Whisper's decoder and BART gather
    their learned position embeddings; :func:`_attained_span`) → dim ≤ n - c. ONNX Runtime refuses a longer input
    at that Gather; a bound from the graph refuses it before the call, with the bound in the manifest."""
    import tvm
    from tvm import relax, tirx

    names = {v.name: v for v in dim_vars.values()}
    lower = dict(lower or {})  # each dim's least value (1, or 0 for a past length)
    found: Dict[str, Tuple[int, str]] = {}
    bindings = {b.var: b.value for block in getattr(func.body, "blocks", []) for b in block.bindings
                if isinstance(b, relax.VarBinding)}

    def note(expr, limit, why):
        if isinstance(expr, tirx.Var) and expr.name in names and int(limit) < found.get(expr.name, (limit + 1,))[0]:
            found[expr.name] = (int(limit), why)

    def static_axis(data, axis):
        shape = getattr(getattr(data, "ty", None), "shape", None)
        if not isinstance(data, tvm.ir.GenericConst) or shape is None or not 0 <= axis < len(shape.values):
            return None
        n = shape.values[axis]
        return int(n) if isinstance(n, tirx.IntImm) else None

    def gathered(e):
        """``take(constant table, indices)`` with indices whose largest value is exactly ``dim + c``."""
        if getattr(e.attrs, "mode", "fast") != "fast" or e.attrs.axis is None:  # wrap / clip define any index
            return
        data = bindings.get(e.args[0], e.args[0]) if isinstance(e.args[0], relax.Var) else e.args[0]
        n = static_axis(data, int(e.attrs.axis))
        span = _attained_span(e.args[1], bindings) if n is not None else None
        if span is None:
            return
        lo, dim, shift, past = span
        if past is None:
            if dim.name in names and lo >= 0 and n - 1 - shift >= 1:
                note(dim, n - 1 - shift, f"the graph gathers rows {lo} .. {dim.name}{shift:+d} of a constant table "
                                         f"of {n} rows")
            return
        # positions after a cache (GPT-2's arange(past, past + seq)): past + seq + shift <= n - 1 bounds each dim
        # by the table less the other's least value
        if lo < 0 or dim.name not in names or past.name not in names:
            return
        why = f"the graph gathers rows {past.name} .. {past.name} + {dim.name}{shift:+d} of a constant table of {n} rows"
        if cache_positions is not None and n - shift - 1 < cache_positions.get("total", (n + 1,))[0]:
            cache_positions["total"] = (n - shift - 1, f"{past.name} + {dim.name} <= {n - shift - 1}: {why}")
        for this, other in ((dim, past), (past, dim)):
            limit = n - 1 - shift - lower.get(other.name, 1)
            if limit >= lower.get(this.name, 1):
                note(this, limit, why)

    def visit(e):
        if not (isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op)):
            return
        if e.op.name == "relax.take":
            gathered(e)
        if e.op.name == "relax.strided_slice":
            data = e.args[0]
            shape = getattr(getattr(data, "ty", None), "shape", None)
            if not isinstance(data, tvm.ir.GenericConst) or shape is None:
                return
            axes, ends = _int_tuple(e.args[1]), e.args[3]
            if axes is None or not isinstance(ends, (relax.ShapeExpr, relax.Tuple)):
                return
            values = ends.values if isinstance(ends, relax.ShapeExpr) else [_prim_field(f) for f in ends.fields]
            for axis, end in zip(axes, values):
                if end is not None and isinstance(shape.values[axis], tirx.IntImm):
                    n = int(shape.values[axis])
                    note(end, n, f"the graph slices a constant table of {n} rows by it")

    relax.analysis.post_order_visit(func, visit)
    return found


def _int_tuple(e) -> Optional[List[int]]:
    from tvm import relax, tirx

    if isinstance(e, relax.ShapeExpr):
        vals = e.values
    elif isinstance(e, relax.Tuple):
        vals = [_prim_field(f) for f in e.fields]
    else:
        return None
    return [int(v) for v in vals] if all(isinstance(v, tirx.IntImm) for v in vals) else None


def _prim_field(field):
    """A relax tuple field as a PrimExpr: TVM 0.27 puts an op's integer arguments (``strided_slice``'s axes and
    ends) in the tuple as PrimExprs themselves, older builds as a ``PrimValue`` holding one; else None."""
    import tvm

    if tvm.ir.is_prim_expr(field):
        return field
    value = getattr(field, "value", None)
    return value if tvm.ir.is_prim_expr(value) else None


#: ops whose output holds every value of their (first) input and no other: the largest index survives them
_SAME_VALUES = {"relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.broadcast_to", "relax.permute_dims",
                "relax.tile", "relax.repeat", "relax.flip"}


def _attained_span(e, bindings: dict, depth: int = 0):
    """``(lo, dim, c, None)`` when the integer tensor ``e`` holds exactly the values ``lo .. dim + c`` (``arange(lo,
    dim + c + 1)``, broadcast, reshaped or shifted by a constant); ``(lo, dim, c, past)`` when it holds ``past + lo ..
    past + dim + c`` (positions after a cache: ``arange(past, past + dim + c + 1)``); else None. Exact, not a bound: a slice, a gather or a
    ``where`` of positions may drop the largest one (a clamp written as ``where(p < n, p, 0)``), and a bound taken
    from an index that is never reached would refuse inputs the model accepts."""
    import tvm
    from tvm import relax, tirx

    if depth > 24:
        return None
    if isinstance(e, relax.Var) and e in bindings:
        return _attained_span(bindings[e], bindings, depth + 1)
    if not (isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op)):
        return None
    name, args = e.op.name, e.args
    if name == "relax.arange":
        start, end, step = (_prim_field(a) for a in args)
        if not (isinstance(step, tirx.IntImm) and int(step.value) == 1) or end is None:
            return None
        if isinstance(start, tirx.Var):  # arange(past, past + dim + c + 1): the values past .. past + dim + c
            free = [v for v in tirx.analysis.undefined_vars(end - start) if not v.same_as(start)]
            if len(free) != 1 or start in list(tirx.analysis.undefined_vars(tvm.sym.Analyzer().simplify(end - start))):
                return None
            shift = tvm.sym.Analyzer().simplify(end - start - free[0] - 1)
            return (0, free[0], int(shift.value), start) if isinstance(shift, tirx.IntImm) else None
        if not isinstance(start, tirx.IntImm):
            return None
        free = list(tirx.analysis.undefined_vars(end))
        if len(free) != 1:
            return None
        shift = tvm.sym.Analyzer().simplify(end - free[0] - 1)
        return (int(start.value), free[0], int(shift.value), None) if isinstance(shift, tirx.IntImm) else None
    if name in _SAME_VALUES or (name == "relax.astype" and str(e.ty.dtype).startswith("int")):
        return _attained_span(args[0], bindings, depth + 1)
    if name == "relax.multiply" and _scalar_int(args[1], bindings) == 1:  # an export's `* 1` (a dtype or scale no-op)
        return _attained_span(args[0], bindings, depth + 1)
    if name in ("relax.add", "relax.subtract"):
        inner = _attained_span(args[0], bindings, depth + 1)
        c = _scalar_int(args[1], bindings)
        if inner is not None and c is None and name == "relax.add" and inner[3] is None:
            past = _scalar_dim(args[1], bindings)  # positions shifted by a cache's length (GPT-2's past)
            return (inner[0], inner[1], inner[2], past) if past is not None else None
        if inner is None or c is None:
            return None
        c = c if name == "relax.add" else -c
        return inner[0] + c, inner[1], inner[2] + c, inner[3]
    if name == "relax.where":  # the importer's where(i < 0, i + n, i): an index never negative passes as itself
        cond = bindings.get(args[0], args[0]) if isinstance(args[0], relax.Var) else args[0]
        inner = _attained_span(args[2], bindings, depth + 1)
        if inner is not None and inner[0] >= 0 and isinstance(cond, relax.Call) and \
                getattr(cond.op, "name", "") == "relax.less" and cond.args[0].same_as(args[2]) and \
                _scalar_int(cond.args[1], bindings) == 0:
            return inner
    return None


def _scalar_dim(e, bindings: dict, depth: int = 0):
    """The dim variable a one-element integer tensor holds exactly (``shape_to_tensor`` of a shape, one element
    taken from it, reshaped or cast), else None."""
    import tvm
    from tvm import relax, tirx

    if depth > 8:
        return None
    if isinstance(e, relax.Var) and e in bindings:
        return _scalar_dim(bindings[e], bindings, depth + 1)
    if not (isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op)):
        return None
    name, args = e.op.name, e.args
    if name in ("relax.reshape", "relax.squeeze", "relax.expand_dims") or \
            (name == "relax.astype" and str(e.ty.dtype).startswith("int")):
        return _scalar_dim(args[0], bindings, depth + 1)
    shape = bindings.get(args[0], args[0]) if name == "relax.take" and isinstance(args[0], relax.Var) else None
    if name == "relax.take" and isinstance(shape, relax.Call) and getattr(shape.op, "name", "") == \
            "relax.shape_to_tensor" and isinstance(shape.args[0], relax.ShapeExpr):
        at = _scalar_int(args[1], bindings)
        values = shape.args[0].values
        if at is not None and -len(values) <= at < len(values) and isinstance(values[at], tirx.Var):
            return values[at]
    if name == "relax.shape_to_tensor" and isinstance(args[0], relax.ShapeExpr) and len(args[0].values) == 1 \
            and isinstance(args[0].values[0], tirx.Var):
        return args[0].values[0]
    return None


def _scalar_int(e, bindings: dict):
    """The int a one-element constant holds, else None."""
    import tvm
    from tvm import relax

    if isinstance(e, relax.Var) and e in bindings:
        e = bindings[e]
    if not isinstance(e, tvm.ir.GenericConst):  # 0.27's relax.Constant
        return None
    shape = getattr(getattr(e, "ty", None), "shape", None)
    if shape is None or any(not isinstance(d, tvm.tirx.IntImm) or int(d) != 1 for d in shape.values):
        return None  # not one element: read no large constant
    v = e.value.numpy()
    return int(v.reshape(-1)[0]) if v.dtype.kind in "iu" else None


def dynamic_inputs(mod) -> Dict[str, list]:
    """``{ONNX input name: dims}`` of the module's inputs that have a dim known only at run time (ints and
    ``tirx`` expressions); empty for a static module or one without a Relax ``main``."""
    import tvm

    names = [gv.name_hint for gv in mod.get_global_vars()]
    main = mod["main"] if "main" in names else None
    if main is None or not isinstance(main, tvm.relax.Function):
        return {}
    onnx_names = [str(n) for n in (main.attrs or {}).get("onnx_input_names", [])]
    names = onnx_names or [str(p.name) for p in main.params]
    out = {}
    for name, param in zip(names, main.params):
        values = list(getattr(getattr(param.ty, "shape", None), "values", None) or [])
        if any(not isinstance(v, tvm.tirx.IntImm) for v in values):
            out[name] = [int(v) if isinstance(v, tvm.tirx.IntImm) else v for v in values]
    return out


def pinning_example(dynamic: Dict[str, list]) -> str:
    """A ``--shape`` value pinning every dynamic dim of ``dynamic`` (:func:`dynamic_inputs`): one row for a leading
    run-time dim, 128 for any other."""
    return ",".join(f"{name}:" + "x".join(str(d) if isinstance(d, int) else "1" if k == 0 else "128"
                                         for k, d in enumerate(dims)) for name, dims in dynamic.items())
