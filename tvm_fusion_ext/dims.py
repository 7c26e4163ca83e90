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
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Dict, List, Optional, Tuple

from .errors import InputError, ModelLoadError

#: TVM's own function attribute for symbolic-dim upper bounds (read by Relax memory planning)
BOUND_ATTR = "tir_var_upper_bound"
#: TVM's function attribute listing symbolic dims known to be non-negative
NON_NEGATIVE_ATTR = "tir_non_negative_var"
DEFAULT_BATCH_BOUND = 64
DEFAULT_SEQ_BOUND = 512


def input_dims(graph_inputs, shapes: Optional[Mapping[str, Sequence[int]]], label: str):
    """``({input: [int | tirx.Var per dim]}, {dim name: tirx.Var})`` for the importer; pinned dims from ``shapes``."""
    from tvm import tirx

    shapes = dict(shapes or {})
    known = [i.name for i in graph_inputs]
    for name in shapes:
        if name not in known:
            raise InputError(f"{label}: shapes names unknown input {name!r}; model inputs are: {', '.join(known)}")
    out: Dict[str, list] = {}
    dim_vars: Dict[str, tirx.Var] = {}
    for vi in graph_inputs:
        name = vi.name
        if name in shapes and _rank_unknown(vi, label):
            out[name] = [_as_dim(d, name, label) for d in shapes[name]]  # shapes= is what gives it a rank
            continue
        declared = declared_dims(vi, label)
        if name in shapes:
            given = [_as_dim(d, name, label) for d in shapes[name]]
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
            dim_name = _identifier(d if d != "?" else f"{name}_dim{k}")
            dims.append(dim_vars.setdefault(dim_name, tirx.Var(dim_name, "int64")))
        out[name] = dims
    return out, dim_vars


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
                 label: str) -> Dict[str, int]:
    """An upper bound for every symbolic dim (see the module docstring for where each comes from)."""
    given = _given_bounds(dim_vars, graph_inputs, max_shapes, label)
    seen = _graph_bounds(mod["main"], dim_vars)
    leading = {_dim_at(vi, 0) for vi in graph_inputs}
    bounds = {}
    for name in dim_vars:
        if name in given:
            bounds[name] = given[name]
        elif name in seen:
            bounds[name] = seen[name]
        else:
            bounds[name] = DEFAULT_BATCH_BOUND if name in leading else DEFAULT_SEQ_BOUND
    return bounds


def shape_bounds(mod) -> Dict[str, Tuple[int, int]]:
    """``{dim name: (1, upper bound)}`` of a module's symbolic input dims (empty for a static module)."""
    attrs = mod["main"].attrs
    if attrs is None or BOUND_ATTR not in attrs:
        return {}
    return {str(k): (1, int(v)) for k, v in attrs[BOUND_ATTR].items()}


def with_bounds(func, bounds: Dict[str, int]):
    """``func`` with the bound attributes set (TVM reads them; so do our loaders)."""
    if not bounds:
        return func
    return func.with_attrs({BOUND_ATTR: {k: int(v) for k, v in bounds.items()},
                            NON_NEGATIVE_ATTR: sorted(bounds)})


# ---------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------

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


def _as_dim(d, name, label) -> int:
    try:
        v = int(d)
    except (TypeError, ValueError):
        raise InputError(f"{label}: shape of input {name!r} has non-integer dimension {d!r}") from None
    if v <= 0 or v != d:
        raise InputError(f"{label}: shape of input {name!r} has invalid dimension {d!r} (must be a positive integer)")
    return v


def _given_bounds(dim_vars, graph_inputs, max_shapes, label) -> Dict[str, int]:
    out: Dict[str, int] = {}
    if not max_shapes:
        return out
    by_name = {vi.name: vi for vi in graph_inputs}
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


def _graph_bounds(func, dim_vars) -> Dict[str, int]:
    """Bounds the graph itself implies: ``strided_slice(constant, end=dim)`` along an axis of n → dim ≤ n."""
    import tvm
    from tvm import relax, tirx

    names = {v.name: v for v in dim_vars.values()}
    found: Dict[str, int] = {}

    def note(expr, limit):
        if isinstance(expr, tirx.Var) and expr.name in names:
            found[expr.name] = min(found.get(expr.name, limit), int(limit))

    def visit(e):
        if not (isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op)):
            return
        if e.op.name == "relax.strided_slice":
            data = e.args[0]
            shape = getattr(getattr(data, "ty", None), "shape", None)
            if not isinstance(data, tvm.ir.GenericConst) or shape is None:
                return
            axes, ends = _int_tuple(e.args[1]), e.args[3]
            if axes is None or not isinstance(ends, (relax.ShapeExpr, relax.Tuple)):
                return
            values = ends.values if isinstance(ends, relax.ShapeExpr) else [getattr(f, "value", None)
                                                                          for f in ends.fields]
            for axis, end in zip(axes, values):
                if end is not None and isinstance(shape.values[axis], tirx.IntImm):
                    note(end, int(shape.values[axis]))

    relax.analysis.post_order_visit(func, visit)
    return found


def _int_tuple(e) -> Optional[List[int]]:
    from tvm import relax, tirx

    if isinstance(e, relax.ShapeExpr):
        vals = e.values
    elif isinstance(e, relax.Tuple):
        vals = [getattr(f, "value", None) for f in e.fields]
    else:
        return None
    return [int(v) for v in vals] if all(isinstance(v, tirx.IntImm) for v in vals) else None
