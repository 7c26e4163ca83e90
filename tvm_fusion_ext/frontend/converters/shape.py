"""Shapes, sizes, constants and indexing: Constant's ``value_*`` forms, ConstantOfShape/Expand/Range/Concat of
sizes read with ``Shape``, size inputs folded to constants (Slice, Pad, Split), Gather/ScatterND/Tile/OneHot of
sizes. Reshape, Slice and Pad read against the input ranges have their own modules."""

from __future__ import annotations

from typing import Dict

import numpy as np

from ..errors import Unsupported
from .common import Fixed, dtype_of, int_elements, ndim_of, scalar_tensor, static_int_inputs


def _constant_of_shape_class():
    """Fixed ``ConstantOfShape`` converter (built lazily so importing this module does not import TVM).

    Root cause of the stock failure: ONNX stores ``value`` as a one-element tensor of shape ``[1]``. The stock
    converter keeps that rank-1 tensor and calls ``broadcast_to(value, shape)``. The legacy exporter emits
    ``ConstantOfShape`` with an *empty* shape input (the result is a scalar, used to build the attention mask),
    and broadcasting a rank-1 tensor to rank 0 is illegal ("broadcast_to expects the input shape to have the
    number of ndim at least as the input tensor's"). Its constant-shape fast path only covers rank-1 results.
    The fix: take ``value`` as a scalar (the spec says it has exactly one element) and fold any fully constant
    shape, including the empty one, to a constant.
    """
    import tvm
    from tvm import relax, tirx
    from tvm.relax.frontend.onnx import onnx_frontend as of

    class _ConstantOfShape(of.ConstantOfShape):
        @classmethod
        def _impl_v9(cls, bb, inputs, attr, params):
            # a shape computed from sizes (Swin's pad widths: ``Sub(4, Gather(Shape(x)))``) folds to its values, not
            # fresh run-time dims, so that the tensors built from it keep shapes the graph can reason about
            shape = static_int_inputs(bb, [of.get_constant(inputs[0], params)], (0,))[0]
            attr_value = attr.get("value")
            value = of.get_numpy(attr_value).reshape(()) if attr_value is not None else np.array(0, "float32")
            dtype = str(value.dtype)
            dims = None
            if isinstance(shape, tvm.ir.GenericConst):
                dims = [int(x) for x in shape.value.numpy().reshape(-1)]
            elif isinstance(shape, relax.ShapeExpr) and all(isinstance(x, tirx.IntImm) for x in shape.values):
                dims = [int(x) for x in shape.values]
            if dims is not None:
                return relax.const(np.full(dims, value, dtype), dtype)
            if not isinstance(shape, relax.ShapeExpr):
                shape = _shape_from_tensor(bb, shape)
            return relax.op.broadcast_to(relax.const(value, dtype), shape)

    return _ConstantOfShape


def _expand_class():
    """``Expand`` to a shape computed at run time (a ``ShapeExpr`` with symbolic dims).

    The stock converter decides whether the expansion is a no-op with ``target_shape == data_shape``, a Python
    list comparison that asks ``bool()`` of a symbolic ``PrimExpr`` and raises as soon as a dim is symbolic
    (every dynamic-axis export, and static builds of them, hit it). Same broadcasting rules, with the
    comparison done structurally. A constant target shape over data with symbolic dims (GPT-J, CodeGen, GLM,
    Cohere: ``position_ids.unsqueeze(-1).repeat(1, 1, d)`` under dynamic axes) takes the same path: the stock
    converter reads every data dim as a number there."""
    import tvm
    import tvm_ffi
    from tvm import relax, tirx
    from tvm.relax.frontend.onnx import onnx_frontend as of

    class _Expand(of.Expand):
        @classmethod
        def _impl_v13(cls, bb, inputs, attr, params):
            data, shape = inputs[0], inputs[1]
            if tvm.ir.is_prim_expr(data):  # a size kept as a bare scalar (``Expand(Gather(Shape(x), 0), [])``)
                data = scalar_tensor(bb, data)
                inputs = [data, shape]
            if isinstance(shape, tvm.ir.GenericConst):
                if all(isinstance(d, tirx.IntImm) for d in data.ty.shape.values):
                    return super()._impl_v13(bb, inputs, attr, params)
                shape = _constant_target_shape(data, shape)
            if not isinstance(shape, relax.ShapeExpr):
                # a shape known only at run time: the stock converter broadcasts to it verbatim, so a target dim
                # of 1 shrinks the input's (ONNX keeps the input's dim: [3, 1] expanded by [2, 1, 6] is [2, 3, 6])
                shape = _shape_from_tensor(bb, shape)
                data_shape = list(data.ty.shape.values)
                target = list(shape.values)
                if len(target) < len(data_shape):
                    target = [tirx.IntImm("int64", 1)] * (len(data_shape) - len(target)) + target
                data_shape = [tirx.IntImm("int64", 1)] * (len(target) - len(data_shape)) + data_shape
                padded = data if len(data_shape) == len(data.ty.shape.values) else \
                    bb.normalize(relax.op.reshape(data, relax.ShapeExpr(data_shape)))
                out = [want if isinstance(have, tirx.IntImm) and int(have) == 1 else
                       have if isinstance(have, tirx.IntImm) else tirx.max(want, have)
                       for want, have in zip(target, data_shape)]
                return relax.op.broadcast_to(padded, relax.ShapeExpr(out))
            data_shape = list(data.ty.shape.values)
            target = list(shape.values)
            if len(target) < len(data_shape):
                target = data_shape[: len(data_shape) - len(target)] + target
            data_shape = [tirx.IntImm("int64", 1)] * (len(target) - len(data_shape)) + data_shape
            out = []
            for want, have in zip(target, data_shape):
                if isinstance(want, tirx.IntImm) and int(want) in (-1, 1):
                    out.append(have)  # -1 keeps the input's dim; 1 never shrinks one (ONNX broadcasting)
                elif isinstance(have, tirx.IntImm) and int(have) == 1:
                    out.append(want)
                else:
                    out.append(want if not isinstance(have, tirx.IntImm) or isinstance(want, tirx.IntImm) else have)
            same = len(out) == len(data.ty.shape.values) and all(
                tvm_ffi.structural_equal(a, b) for a, b in zip(out, data.ty.shape.values))
            return data if same else relax.op.broadcast_to(data, relax.ShapeExpr(out))

    return _Expand


def _constant_target_shape(data, shape):
    """A constant Expand target as a ``ShapeExpr``, refusing static dims ONNX cannot broadcast (a data dim d
    against a target t needs d == t, d == 1 or t == 1)."""
    from tvm import relax, tirx

    target = [int(v) for v in shape.value.numpy().reshape(-1)]
    dims = list(data.ty.shape.values)
    for axis, (d, t) in enumerate(zip(reversed(dims), reversed(target))):
        if isinstance(d, tirx.IntImm) and int(d) not in (1, t) and t not in (1, -1):
            raise Unsupported(f"cannot broadcast data dim {int(d)} to {t} at axis {len(dims) - 1 - axis}")
    return relax.ShapeExpr([tirx.IntImm("int64", t) for t in target])


def _shape_from_tensor(bb, tensor):
    """A ``ShapeExpr`` of fresh symbolic dims bound to a 1-D int64 tensor's values at run time (legalizing
    ``broadcast_to`` needs the target as a ``ShapeExpr``, not as a call that yields a shape)."""
    from tvm import relax, tirx

    (length,) = tensor.ty.shape.values
    shape = bb.emit(relax.op.tensor_to_shape(tensor))
    dims = [tirx.Var(f"shape_{i}", "int64") for i in range(int(length))]
    bb.match_cast(shape, relax.ShapeType(dims))
    return relax.ShapeExpr(dims)


def _range_class():
    """``Range`` whose bounds are computed from input sizes (``Range(0, Shape(x)[1], 1)``).

    The stock converter turns a bound that is not a constant into a data-dependent length: a fresh variable
    (``range_len_0``) bound at run time, unrelated to the input dim it equals, so every tensor built from the
    range (position ids, masks) gets shapes that cannot be matched with the inputs' (``[range_len_0, 1, seq,
    seq]`` + ``[batch, 12, seq, seq]`` has no known shape, and a later ``Reshape`` with ``-1`` fails). When the
    bounds are sizes (see :mod:`..symbolic_values`), the range is an ``arange`` with a symbolic length."""
    from tvm import relax, tirx
    from tvm.relax.frontend.onnx import onnx_frontend as of

    from ..symbolic_values import Evaluator

    class _Range(of.Range):
        @classmethod
        def _impl_v12(cls, bb, inputs, attr, params):
            dtype = str(getattr(getattr(inputs[0], "ty", None), "dtype", ""))
            if dtype.startswith("int"):
                ev = Evaluator(bb.lookup_binding)
                values = [ev.elements(x) for x in inputs[:3]]
                if all(v is not None and len(v) == 1 for v in values):
                    start, limit, delta = (v[0] for v in values)
                    if isinstance(delta, tirx.IntImm) and int(delta) > 0:
                        return relax.op.arange(start, limit, delta, dtype)
            return super()._impl_v12(bb, inputs, attr, params)

    return _Range


#: converters whose size inputs may be computed from sizes that are static, and where: ``{op: {impl: positions}}``
#: (None: every input after the data). The stock converters read constants only; such inputs are folded first.
_SIZE_INPUTS = {
    # torch.chunk in a legacy export: bounds from ``Shape → Gather → Add → Div → Mul`` on a fixed shape. Without
    # them the slice has an unknown shape and the next Reshape with -1 fails (Phi-3's merged gate_up_proj,
    # GPT-NeoX's merged qkv); bounds that stay symbolic are left to the stock converter
    "Slice": {"_impl_v13": None},
    # F.pad in a legacy export: Swin pads its feature map to whole windows (``Shape → Mod → Concat → Reshape →
    # Slice(step -1) → Transpose``), MobileBERT its trigram embeddings; pads that depend on a run-time size are
    # left to pad.py, which the importer tries first
    "Pad": {"_impl_v11": (1,), "_impl_v18": (1, 3), "_impl_v19": (1, 3)},
    # expanded function bodies split the rotated part of a head in halves: ``Div(Shape(x)[-1:], 2)``
    "Split": {"_impl_v13": (1,)},
}


def _size_folding_class(op: str):
    """TVM's converter for ``op`` with the inputs :data:`_SIZE_INPUTS` names folded to constants where every
    element evaluates to an integer (see :mod:`..symbolic_values`)."""
    from tvm.relax.frontend.onnx import onnx_frontend as of

    def folding(impl, positions):
        def convert(cls, bb, inputs, attr, params):
            inputs = of.onnx_input(inputs)  # a copy that reads None past its end, as the stock one does
            where = range(1, len(inputs)) if positions is None else positions
            return getattr(super(folded, cls), impl)(bb, static_int_inputs(bb, inputs, where), attr, params)

        return classmethod(convert)

    folded = type(f"_{op}", (getattr(of, op),),
                  {impl: folding(impl, positions) for impl, positions in _SIZE_INPUTS[op].items()})
    return folded


def _concat_class():
    """``Concat`` of sizes read with ``Shape`` and small int64 tensors computed from them (the expanded function
    bodies of ONNX ops build target shapes so: ``Concat(Shape(q)[0:1], Shape(k)[1:2], Where(...), ...)``).

    The stock converter handles all-shape or all-constant inputs and passes a mix straight to ``relax.concat``,
    which refuses shapes ("expects the input to be a Tuple of Tensors"). A mix whose tensors evaluate to sizes
    (see :mod:`..symbolic_values`) becomes one shape, which keeps dims symbolic for the ``Expand``/``Reshape``
    reading it; otherwise the shapes become tensors and are concatenated as tensors."""
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as of

    from ..symbolic_values import Evaluator

    class _Concat(of.Concat):
        @classmethod
        def _impl_v13(cls, bb, inputs, attr, params):
            is_shape = [isinstance(x, relax.Expr) and isinstance(getattr(x, "ty", None), relax.ShapeType)
                        or isinstance(x, relax.ShapeExpr) for x in inputs]
            if not any(is_shape) or all(is_shape):
                return super()._impl_v13(bb, inputs, attr, params)
            ev = Evaluator(bb.lookup_binding)
            values = []
            for x, shape in zip(inputs, is_shape):
                dims = list(x.values) if isinstance(x, relax.ShapeExpr) else (
                    list(x.ty.values) if shape and x.ty.values is not None else None)
                if dims is None and not shape and str(getattr(x.ty, "dtype", "")) == "int64" and x.ty.ndim == 1:
                    dims = ev.elements(x)
                if dims is None:
                    break
                values.extend(dims)
            else:
                return relax.ShapeExpr(values)
            tensors = [bb.normalize(relax.op.shape_to_tensor(x)) if shape else x for x, shape in zip(inputs, is_shape)]
            return relax.op.concat(tensors, axis=int(attr.get("axis", 0)))

    return _Concat


def _one_hot(indices: np.ndarray, depth: int, values: np.ndarray, axis: int) -> np.ndarray:
    """ONNX OneHot on constants: negative indices count from ``depth``; out-of-range ones give ``off``."""
    idx = np.where(indices < 0, indices + depth, indices).astype(np.int64)
    axis = axis + idx.ndim + 1 if axis < 0 else axis
    positions = np.arange(depth).reshape([depth if i == axis else 1 for i in range(idx.ndim + 1)])
    return np.where(np.expand_dims(idx, axis) == positions, values[1], values[0]).astype(values.dtype)


def converters() -> Dict[str, type]:
    """``{op name: converter class}`` of this family, to lay over TVM's converter map."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as of

    class Constant(Fixed, of.Constant):
        """``value_float``, ``value_floats``, ``value_int``, ``value_ints`` (the stock converter reads ``value`` only;
        ONNX's function bodies use these forms)."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            for key, dtype in (("value_float", "float32"), ("value_floats", "float32"), ("value_int", "int64"),
                               ("value_ints", "int64")):
                if key in attr:
                    return relax.const(np.asarray(attr[key], dtype), dtype)
            if "value" not in attr:
                raise Unsupported("a Constant without a value of a supported form")
            return stock(bb, inputs, attr, params)

    class Gather(Fixed, of.Gather):
        """A shape gathered by a constant 1-D index list stays a shape. ONNX Runtime's transpose optimizer writes
        ``Shape(Transpose(x))`` as ``Gather(Shape(x), perm)``; the stock converter turns that shape into a tensor
        (only a 0-D index keeps a dim), and the Reshape target built from it was then a run-time tensor, which
        TVM's Reshape refuses (BERT and GPT-2 dynamo exports with dynamic axes, optimized at opt_level 1)."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            data, indices = inputs[0], inputs[1]
            if isinstance(data, relax.ShapeExpr) and isinstance(indices, tvm.ir.GenericConst) \
                    and indices.value.numpy().ndim == 1 and int(attr.get("axis", 0)) == 0:
                dims, rank = list(data.values), len(data.values)
                picked = [int(i) + rank if int(i) < 0 else int(i) for i in indices.value.numpy()]
                if all(0 <= i < rank for i in picked):
                    return relax.ShapeExpr([dims[i] for i in picked])
            return stock(bb, inputs, attr, params)

    class ScatterND(Fixed, of.ScatterND):
        """Updates with no elements write nothing: the data passes through. X-MOD's dynamo export routes each
        language's rows through its adapter by a boolean-mask ``index_put``; a language no row has leaves a
        ``ScatterND`` of ``[0]`` updates, whose stock kernel divides by the empty extent while it is built (a
        crash)."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            shape = getattr(inputs[2].ty, "shape", None)
            dims = getattr(shape, "values", None) or ()
            if any(isinstance(d, tvm.tirx.IntImm) and int(d) == 0 for d in dims):
                return inputs[0]
            return stock(bb, inputs, attr, params)

    class Tile(Fixed, of.Tile):
        """Repeats given as sizes (DeBERTa's dynamo export repeats its relative-position keys ``batch`` times:
        ``Concat(Shape(ids)[0:1], 1, 1)``). The stock converter makes them an opaque kernel whose output dims are
        fresh variables, which FuseTIR then cannot reconcile with its consumers (``batch * 4``); written as a
        broadcast and reshapes, the output shape is ``[r·d for each axis]`` and every later pass sees it."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            data, reps = inputs[0], inputs[1]
            if isinstance(reps, relax.Call) and reps.op.same_as(tvm.ir.Op.get("relax.shape_to_tensor")):
                reps = reps.args[0]  # the importer hands sizes to tensor-taking ops as a tensor of them
            if isinstance(reps, relax.Call) and reps.op.same_as(tvm.ir.Op.get("relax.reshape")) and isinstance(
                    reps.args[0], tvm.ir.GenericConst):
                reps = reps.args[0]  # CANINE's legacy export: repeats are a reshaped OneHot of constants
            if not isinstance(reps, relax.ShapeExpr):
                values = int_elements(bb, reps)  # constant repeats, or computed from sizes
                reps = relax.ShapeExpr(values) if values is not None else reps
            shape = getattr(getattr(data, "ty", None), "shape", None)
            if not isinstance(reps, relax.ShapeExpr) or shape is None or not hasattr(shape, "values"):
                return stock(bb, inputs, attr, params)
            dims, r = list(shape.values), list(reps.values)
            if len(r) < len(dims):
                r = [1] * (len(dims) - len(r)) + r
            if len(dims) < len(r):
                dims = [1] * (len(r) - len(dims)) + dims
            # out[t·d + a] = x[a] per axis, t outer: x viewed as [1, d0, 1, d1, …] and broadcast to [r0, d0, r1, d1, …]
            spread = bb.normalize(relax.op.reshape(data, [v for d in dims for v in (1, d)]))
            spread = bb.normalize(relax.op.broadcast_to(spread, [v for t, d in zip(r, dims) for v in (t, d)]))
            return relax.op.reshape(spread, [t * d for t, d in zip(r, dims)])

    class OneHot(Fixed, of.OneHot):
        """``values`` computed at run time (CANINE's legacy export): ``where(indices == position, on, off)`` along
        ``axis``. The stock converter takes constant values only (an assert, which read as a crash)."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            indices, depth, values = inputs
            static = int_elements(bb, values) if isinstance(indices, tvm.ir.GenericConst) and isinstance(
                depth, tvm.ir.GenericConst) and not isinstance(values, tvm.ir.GenericConst) else None
            if static is not None and all(isinstance(v, tvm.tirx.IntImm) for v in static):
                # every input known at import (CANINE's legacy export: values read from a static shape, the
                # result the repeats of a Tile, which must be constants): computed here
                return relax.const(_one_hot(indices.value.numpy(), int(depth.value.numpy().reshape(-1)[0]),
                                            np.asarray([int(v) for v in static], dtype_of(values)),
                                            int(attr.get("axis", -1))))
            if isinstance(values, tvm.ir.GenericConst) or not isinstance(depth, tvm.ir.GenericConst):
                return stock(bb, inputs, attr, params)
            n = int(np.asarray(depth.value.numpy()).reshape(-1)[0])
            if not dtype_of(indices).startswith("int"):  # ONNX: non-integer indices are cast to integers
                indices = bb.normalize(relax.op.astype(indices, "int64"))
            rank, dt = ndim_of(indices), dtype_of(indices)
            axis = int(attr.get("axis", -1))
            axis = axis + rank + 1 if axis < 0 else axis
            if not 0 <= axis <= rank:
                raise Unsupported(f"OneHot axis {attr.get('axis')} for indices of rank {rank}")
            wrapped = relax.op.where(relax.op.less(indices, relax.const(0, dt)),
                                     relax.op.add(indices, relax.const(n, dt)), indices)
            along_axis = [n if i == axis else 1 for i in range(rank + 1)]
            positions = relax.op.reshape(relax.op.arange(0, n, 1, dt), along_axis)
            hit = relax.op.equal(relax.op.expand_dims(wrapped, axis), positions)
            off, on = (relax.op.take(values, relax.const(i, "int64"), axis=0) for i in (0, 1))
            return relax.op.where(hit, on, off)

    table = {"Constant": Constant, "Gather": Gather, "ScatterND": ScatterND, "Tile": Tile, "OneHot": OneHot,
             "ConstantOfShape": _constant_of_shape_class(), "Expand": _expand_class(), "Range": _range_class(),
             "Concat": _concat_class()}
    table.update({op: _size_folding_class(op) for op in _SIZE_INPUTS})
    return table
