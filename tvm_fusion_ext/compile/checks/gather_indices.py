"""Gather/scatter indices checked in range at run time, where TVM's kernels read (or write) past the buffer.

TVM's ``take`` (ONNX ``Gather``, imported with ``mode="fast"``), ``gather_nd``, ``gather_elements``,
``scatter_nd`` and ``scatter_elements`` kernels index their data without a bounds check (``ClampGatherIndices``
then clamps ``take``'s, which is defined but still wrong: a token id past the vocabulary read the last row). An export that computes its indices from the inputs' shapes then gives a wrong answer,
or writes past a buffer, when the inputs do not fit together: the dynamo KV-cache export gathers
``attention_mask`` at positions ``0 .. past + new - 1`` and at batch rows ``0 .. batch - 1``, so a mask shorter
than the cache, or with fewer rows, was read past its end where ONNX Runtime refuses (``GatherND``: invalid
index).

Per indexed axis, the number of indices outside ``[0, dim)`` is counted and turned into a shape that is
match-cast to ``0``: the VM checks it on every call, with no Python, so a runtime-only deployment refuses too.
The match-cast's expected shape carries a tag (``[0, TAG, op, data input + 1, axis, indices input + 1,
static dim or 0, data reshaped]``) that :func:`tvm_fusion_ext.deploy.io.shape_check_error` reads back to name, in one line,
the op, the input the indices come from (token ids past the vocabulary) or else the input the data is (a mask
shorter than the cache), and the axis.

Negative indices: TVM's ONNX importer already adds the axis length to them for every op here but
``ScatterElements``, so an index still negative is one ONNX calls out of range (below ``-dim``), and is
refused; ``ScatterElements``' indices are normalised here first (``i < 0 → i + dim``), as ONNX means them.

Skipped where nothing can go wrong: indices whose values provably lie inside their axis, by an interval
analysis of what exports compute them from (constants, ``arange``, shapes, sums and products, value-keeping shape
ops; :func:`index_range`), proved with TVM's arithmetic analyzer, so symbolic ``arange(0, seq)`` into an axis of
``seq`` needs none. A static MiniLM keeps only the checks on ``input_ids`` and ``token_type_ids``. The cost is one small
reduction per indexed axis and a read of its count on the host: kernels of a few thousand indices at most in
the exports seen (token ids, the mask gather).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import tvm
from tvm import relax

from ...deploy.io import INDEX_CHECK_OPS, INDEX_CHECK_TAG as TAG
from ...transform.graph import const_value, is_constant, shape_dims
from ..lowering.mutation import mutate_functions

#: TVM's function attribute for symbolic-dim lower bounds other than 1 (the importer sets 0 for a past length)
LOWER_BOUND_ATTR = "tir_var_lower_bound"

# relax op -> its code in the check's tag (deploy.io names it back)
_CODES = {"relax." + {"Gather": "take", "GatherND": "gather_nd", "GatherElements": "gather_elements",
                      "ScatterND": "scatter_nd", "ScatterElements": "scatter_elements"}[name]: code
          for code, name in INDEX_CHECK_OPS.items()}
# ops whose last indices axis holds one index per data axis (after any batch dims), not one index per element
_COLUMNS = {"relax.gather_nd", "relax.scatter_nd"}
# ops whose negative indices TVM's ONNX importer leaves to the kernel
_NEGATIVE_LEFT = {"relax.scatter_elements"}
# ops that keep their input's shape, through which a tensor is still "that input" for the message
_SAME_SHAPE = {"relax.astype", "relax.negative", "relax.logical_not", "relax.abs"}


def _input_position(e: relax.Expr, params: List[relax.Var], bindings: dict) -> tuple:
    """``(position in params, reshaped)`` of the function input ``e`` is, through shape-keeping ops, reshapes
    (then ``reshaped``: its axes are not the input's) and the importer's ``where(i < 0, i + n, i)``; else
    ``(-1, False)``."""
    reshaped = False
    for _ in range(8):
        if isinstance(e, relax.Var) and e in bindings:
            e = bindings[e]
            continue
        if isinstance(e, relax.Var):
            return next((i for i, p in enumerate(params) if p.same_as(e)), -1), reshaped
        name = e.op.name if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None
        if name in _SAME_SHAPE or name == "relax.reshape":
            reshaped = reshaped or name == "relax.reshape"
            e = e.args[0]
            continue
        if name == "relax.where":  # a negative-index normalisation keeps the index in its third operand
            e = e.args[2]
            continue
        return -1, False
    return -1, False


# ops whose output values are some of their first input's (or, for concat, of its inputs')
_VALUE_SUBSET = {"relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.strided_slice", "relax.broadcast_to",
                 "relax.permute_dims", "relax.take", "relax.astype", "relax.concat", "relax.flip", "relax.tile",
                 "relax.repeat"}
_RANGE_DEPTH = 24


def _as_int(e) -> object:
    """An int for a constant PrimExpr, else the PrimExpr itself (symbolic)."""
    return int(e.value) if isinstance(e, tvm.tirx.IntImm) else e


def _shape_values(e, bindings: dict):
    """The PrimExprs of a Shape-valued expression (a ShapeExpr, or ``shape_of`` a tensor of known shape)."""
    if isinstance(e, relax.Var) and e in bindings:
        e = bindings[e]
    if isinstance(e, relax.ShapeExpr):
        return list(e.values)
    if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.shape_of":
        dims = shape_dims(e.args[0])
        return None if dims is None else [tvm.tirx.IntImm("int64", d) if isinstance(d, int) else d for d in dims]
    ty = getattr(e, "ty", None)
    if isinstance(ty, relax.ShapeType) and ty.values is not None:
        return list(ty.values)
    return None


def index_range(e: relax.Expr, bindings: dict, depth: int = 0, lower: Optional[Dict[str, int]] = None):
    """``(lo, hi)``, PrimExprs bounding every value of the integer tensor ``e``, or None when unknown: what the
    exports compute their indices from (constants, ``arange``, shapes, and sums and products of them). ``lower``:
    the dims whose range starts below 1 (a past length may be 0), by name."""
    if depth > _RANGE_DEPTH:
        return None
    if isinstance(e, relax.Var) and e in bindings:
        return index_range(bindings[e], bindings, depth + 1, lower)
    if is_constant(e):
        v = const_value(e)
        if v.dtype.kind not in "iub":
            return None
        if v.size == 0:
            return tvm.tirx.IntImm("int64", 0), tvm.tirx.IntImm("int64", -1)
        return tvm.tirx.IntImm("int64", int(v.min())), tvm.tirx.IntImm("int64", int(v.max()))
    if not isinstance(e, relax.Call) or not isinstance(e.op, tvm.ir.Op):
        return None
    name, args = e.op.name, e.args

    def rng(x):
        return index_range(x, bindings, depth + 1, lower)

    if name == "relax.arange":
        start, end, step = args
        if not isinstance(step, tvm.tirx.IntImm) or int(step.value) <= 0:
            return None
        return start, end - 1
    if name == "relax.shape_to_tensor":
        values = _shape_values(args[0], bindings)
        if not values:
            return None
        return tvm.tirx.IntImm("int64", 0), _fold(tvm.tirx.max, values)
    if name == "relax.take":  # one element of a shape: that dim, exactly (an export's Shape -> Gather)
        data = bindings.get(args[0], args[0]) if isinstance(args[0], relax.Var) else args[0]
        if isinstance(data, relax.Call) and isinstance(data.op, tvm.ir.Op) and data.op.name == "relax.shape_to_tensor":
            values, at = _shape_values(data.args[0], bindings), rng(args[1])
            if values and at is not None and isinstance(at[0], tvm.tirx.IntImm) and \
                    isinstance(at[1], tvm.tirx.IntImm) and int(at[0].value) == int(at[1].value) and \
                    -len(values) <= int(at[0].value) < len(values):
                return values[int(at[0].value)], values[int(at[0].value)]
    if name in _VALUE_SUBSET:
        parts = args[0].fields if name == "relax.concat" and isinstance(args[0], relax.Tuple) else [args[0]]
        ranges = [rng(x) for x in parts]
        if any(r is None for r in ranges):
            return None
        return _fold(tvm.tirx.min, [r[0] for r in ranges]), _fold(tvm.tirx.max, [r[1] for r in ranges])
    if name == "relax.where":
        cond = bindings.get(args[0], args[0]) if isinstance(args[0], relax.Var) else args[0]
        b = rng(args[2])
        # the importer's normalisation where(i < 0, i + n, i): with i never negative, only i is taken
        if isinstance(cond, relax.Call) and isinstance(cond.op, tvm.ir.Op) and cond.op.name == "relax.less" \
                and cond.args[0].same_as(args[2]) and b is not None and _prove(b[0] >= 0, lower):
            return b
        a = rng(args[1])
        if a is None or b is None:
            return None
        return tvm.tirx.min(a[0], b[0]), tvm.tirx.max(a[1], b[1])
    if name in ("relax.add", "relax.subtract", "relax.multiply"):
        a, b = rng(args[0]), rng(args[1])
        if a is None or b is None:
            return None
        if name == "relax.add":
            return a[0] + b[0], a[1] + b[1]
        if name == "relax.subtract":
            return a[0] - b[1], a[1] - b[0]
        corners = [x * y for x in a for y in b]
        return _fold(tvm.tirx.min, corners), _fold(tvm.tirx.max, corners)
    return None


def _fold(op, values):
    out = values[0]
    for v in values[1:]:
        out = op(out, v)
    return out


def _prove(cond, lower: Optional[Dict[str, int]] = None) -> bool:
    """``cond`` holds for every value of its dims, each taken >= its lower bound: 1 unless ``lower`` names it
    (a past length may be 0; the runtime refuses an input below the bounds, ``deploy.io.check_inputs``)."""
    if isinstance(cond, bool):
        return cond
    analyzer = tvm.sym.Analyzer()
    for var in tvm.tirx.analysis.undefined_vars(cond):
        low = (lower or {}).get(str(var.name), 1)
        analyzer.bind(var, tvm.ir.Range(tvm.tirx.IntImm("int64", low), tvm.tirx.IntImm("int64", 1 << 40)))
    return bool(analyzer.can_prove(cond))


def _provably_in_range(indices: relax.Expr, dims: list, bindings: dict, columns: bool, negative_ok: bool,
                       lower: Optional[Dict[str, int]] = None) -> bool:
    """Every index provably inside its axis, whatever the inputs (then no check is needed)."""
    if columns and is_constant(indices) and all(isinstance(d, int) for d in dims):  # column by column
        v = const_value(indices).reshape(-1, len(dims))
        bound = np.array(dims)
        return bool(((v >= (-bound if negative_ok else 0)) & (v < bound)).all())
    r = index_range(indices, bindings, lower=lower)
    if r is None:
        return False
    lo, hi = r
    for d in dims:
        d = tvm.tirx.IntImm("int64", d) if isinstance(d, int) else d
        low = -d if negative_ok else tvm.tirx.IntImm("int64", 0)
        if not (_prove(lo >= low, lower) and _prove(hi < d, lower)):
            return False
    return True


def _indexed_axes(call: relax.Call, ds: list, ish: list):
    """The data axes the indices address (one per column for the ND ops), or None if this call is left alone."""
    name = call.op.name
    if name in _COLUMNS:
        first = int(call.attrs.batch_dims) if name == "relax.gather_nd" else 0
        m = ish[-1] if ish else None
        if not isinstance(m, int) or m < 1 or first + m > len(ds):
            return None
        return list(range(first, first + m))
    if name == "relax.take" and (str(call.attrs.mode) != "fast" or call.attrs.axis is None):
        return None  # "clip"/"wrap" define every index; a flat take is not what exporters write
    if not ds:
        return None
    return [int(call.attrs.axis) % len(ds)]


@relax.expr_functor.mutator
class _CheckIndices(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.changed = 0
        self.params: List[relax.Var] = []
        self.bindings: dict = {}
        self.lower: Dict[str, int] = {}

    def enter(self, func: relax.Function) -> None:
        self.params, self.bindings = list(func.params), {}
        attrs = func.attrs
        self.lower = ({str(k): int(v) for k, v in attrs[LOWER_BOUND_ATTR].items()}
                      if attrs is not None and LOWER_BOUND_ATTR in attrs else {})

    def visit_var_binding_(self, binding):
        self.bindings[binding.var] = binding.value
        super().visit_var_binding_(binding)

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        code = _CODES.get(call.op.name) if isinstance(call.op, tvm.ir.Op) else None
        if code is None:
            return call
        data, indices = call.args[0], call.args[1]
        ds, ish = shape_dims(data), shape_dims(indices)
        if ds is None or ish is None or not str(indices.ty.dtype).startswith("int"):
            return call
        axes = _indexed_axes(call, ds, ish)
        normalise = call.op.name in _NEGATIVE_LEFT
        if axes is None or _provably_in_range(indices, [ds[a] for a in axes], self.bindings, call.op.name in _COLUMNS,
                                                  normalise, self.lower):
            return call
        where = (code, _input_position(data, self.params, self.bindings),
                 _input_position(indices, self.params, self.bindings)[0])
        checked = self._checked(indices, ds, axes, call.op.name in _COLUMNS, where, normalise)
        self.changed += 1
        if checked.same_as(indices):
            return call
        args = list(call.args)
        args[1] = checked
        return relax.Call(call.op, args, call.attrs, call.ty_args)

    def _checked(self, indices: relax.Expr, ds: list, axes: list, columns: bool, where: tuple,
                 normalise: bool) -> relax.Expr:
        bb = self.builder_
        code, (data_at, reshaped), indices_at = where
        dtype = str(indices.ty.dtype)
        dims = [ds[a] for a in axes]
        if all(isinstance(d, int) for d in dims):  # a constant: no kernel to make it
            bound = relax.const(np.array(dims if columns else dims[0]), dtype)
        else:
            bound = bb.emit(relax.op.astype(relax.op.shape_to_tensor(relax.ShapeExpr(dims)), dtype))
            if not columns:  # one axis: a scalar bound for every index
                bound = bb.emit(relax.op.reshape(bound, []))
        zero = relax.const(0, dtype)
        norm = indices
        if normalise:
            norm = bb.emit(relax.op.where(relax.op.less(indices, zero), relax.op.add(indices, bound), indices))
        outside = bb.emit(relax.op.astype(relax.op.logical_or(relax.op.less(norm, zero),
                                                              relax.op.greater_equal(norm, bound)), "int64"))
        rank = len(shape_dims(indices))
        for j, axis in enumerate(axes):
            col = outside
            if columns:  # the indices for this axis: one column of the last axis
                col = relax.op.strided_slice(outside, [rank - 1], [j], [j + 1])
            count = bb.emit(relax.op.reshape(relax.op.sum(col, axis=None, keepdims=False), [1]))
            size = ds[axis] if isinstance(ds[axis], int) else 0
            tag = [TAG, code, data_at + 1, axis, indices_at + 1, size, int(reshaped)]
            shape = bb.emit(relax.op.tensor_to_shape(relax.op.concat([count, relax.const(np.array(tag), "int64")],
                                                                     axis=0)))
            bb.match_cast(shape, relax.ShapeType([0] + tag))
        return norm


def CheckGatherIndices() -> tvm.transform.Pass:  # noqa: N802
    """Check every computed gather/scatter index in range at run time (ScatterElements' negative ones
    normalised first): the module docstring."""

    @tvm.transform.module_pass(opt_level=0, name="tfx.CheckGatherIndices")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mutator = _CheckIndices(mod)
        return mutate_functions(mod, mutator, enter=mutator.enter)

    return _pass
