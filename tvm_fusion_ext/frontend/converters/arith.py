"""Elementwise arithmetic and comparisons where TVM's converters compute something else: IsInf's
``detect_*``, BitShift past the type's width, floating-point Mod with infinities, Equal of sizes, integer Pow,
Einsum, Max/Min/Sum/Mean of sizes, and unary ops folded on constants and float sizes."""

from __future__ import annotations

from typing import Dict

import numpy as np

from ..errors import Unsupported
from .common import Fixed, dtype_of, rounded_size_quotient, scalar_tensor


def converters() -> Dict[str, type]:
    """``{op name: converter class}`` of this family, to lay over TVM's converter map."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as of

    class Einsum(Fixed, of.Einsum):
        """A Relax ``einsum`` call, where TVM's converter emits its TE kernel (a ``call_tir`` no rule can read):
        canonicalisation rewrites matrix products to ``matmul`` (``canonical/einsum_matmul.py``: ProphetNet's
        attention), the rest is legalised to the same kernel as before."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            eq = attr["equation"]
            eq = eq.decode("utf-8") if isinstance(eq, bytes) else str(eq)
            try:
                return bb.normalize(relax.op.einsum(list(inputs), eq))
            except Exception:  # noqa: BLE001  (an equation Relax's shape inference does not take: the TE kernel)
                return stock(bb, inputs, attr, params)

    class IsInf(Fixed, of.IsInf):
        """``detect_negative``/``detect_positive`` (the stock converter ignores both and detects either sign)."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            x = inputs[0]
            neg, pos = int(attr.get("detect_negative", 1)), int(attr.get("detect_positive", 1))
            inf = relax.op.isinf(x)
            if neg and pos:
                return inf
            zero = relax.const(0, dtype_of(x))
            if not neg and not pos:
                return relax.op.zeros_like(inf)
            sign = relax.op.less(x, zero) if neg else relax.op.greater(x, zero)
            return relax.op.logical_and(inf, sign)

    class BitShift(Fixed, of.BitShift):
        """Shifts by a negative amount or by the type's width or more give the sign fill (ONNX opset 28 semantics;
        C shifts there are undefined, and TVM's gave ``x`` back or garbage)."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            x, y = inputs
            direction = attr.get("direction", b"LEFT")
            direction = direction.decode() if isinstance(direction, bytes) else direction
            dtype = dtype_of(x)
            bits = np.iinfo(np.dtype(dtype)).bits
            out_of_range = relax.op.logical_or(relax.op.less(y, relax.const(0, dtype)),
                                               relax.op.greater_equal(y, relax.const(bits, dtype)))
            safe = relax.op.where(out_of_range, relax.const(0, dtype), y)
            if direction == "LEFT":
                return relax.op.where(out_of_range, relax.const(0, dtype), relax.op.left_shift(x, safe))
            if direction != "RIGHT":
                raise Unsupported(f"direction {direction!r}")
            fill = (relax.op.right_shift(x, relax.const(bits - 1, dtype)) if np.dtype(dtype).kind == "i"
                    else relax.const(0, dtype))
            return relax.op.where(out_of_range, fill, relax.op.right_shift(x, safe))

    class Mod(Fixed, of.Mod):
        """Floating-point ``fmod=0`` with numpy's semantics at infinities: ``-3 mod inf = inf`` (the stock
        ``floor_mod`` computes ``x - floor(x / y) * y``, which is NaN there). Computed as C ``fmod`` moved into the
        divisor's sign."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            x, y = inputs
            if int(attr.get("fmod", 0)) or not dtype_of(x).startswith(("float", "bfloat")) or all(
                    isinstance(v, tvm.ir.GenericConst) for v in inputs):
                return stock(bb, inputs, attr, params)
            zero = relax.const(0, dtype_of(x))
            r = bb.emit(relax.op.mod(x, y))
            differ = relax.op.logical_xor(relax.op.less(r, zero), relax.op.less(y, zero))
            return relax.op.where(relax.op.logical_and(relax.op.not_equal(r, zero), differ), relax.op.add(r, y), r)

    class Equal(Fixed, of.Equal):
        """A size read with ``Shape`` compared with a constant or another size. The stock converter compares the
        two as IR objects, so ``Shape(x)[0:1] == [1]`` is False when x's first dim is 1 (a Python int is never
        structurally equal to an ``IntImm``), and a symbolic dim is unequal to everything, whatever it is at run
        time: a wrong answer either way. Here static values compare as numbers, symbolic ones by the analyzer
        (every dim at least 1, so ``seq == -1``, the legacy exporters' "keep this dim" test, is False at import
        and the target stays a shape) when it can prove the result, and the rest at run time."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            from tvm import tirx

            from ..symbolic_values import Evaluator

            sizes = [isinstance(x, relax.ShapeExpr) for x in inputs]
            if not any(sizes) or not all(isinstance(x, (tvm.ir.GenericConst, relax.ShapeExpr)) for x in inputs):
                return stock(bb, inputs, attr, params)
            values = [list(x.values) if size else (x.value.numpy().reshape(-1).tolist()
                                                   if x.value.numpy().ndim == 1 else None)
                      for x, size in zip(inputs, sizes)]
            if None not in values and len(values[0]) == len(values[1]):
                diffs = [tirx.const(a, "int64") - b if isinstance(a, int) else a - b for a, b in zip(*values)]
                # the evaluator's analyzer knows every size is at least 1
                dims = {v for d in diffs for v in tirx.analysis.undefined_vars(d)}
                analyzer, out = Evaluator(bb.lookup_binding, list(dims)).analyzer, []
                for diff in diffs:
                    if analyzer.can_prove(diff == 0) or analyzer.can_prove(diff != 0):
                        out.append(bool(analyzer.can_prove(diff == 0)))
                    else:
                        break
                else:
                    return relax.const(np.array(out, bool), "bool")
            tensors = [relax.op.shape_to_tensor(x) if size else x for x, size in zip(inputs, sizes)]
            return relax.op.equal(*tensors)

    class Pow(Fixed, of.Pow):
        """Integer bases and exponents of another type (TVM's ``power`` takes one floating-point type): computed in
        float64 and cast back to the base's type."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            x, y = inputs
            if all(isinstance(v, tvm.ir.GenericConst) for v in inputs) or not all(
                    isinstance(getattr(v, "ty", None), relax.TensorType) for v in inputs):
                return stock(bb, inputs, attr, params)
            xt, yt = dtype_of(x), dtype_of(y)
            if xt.startswith("float") and xt == yt:
                return stock(bb, inputs, attr, params)
            if xt.startswith("float"):
                return relax.op.power(x, relax.op.astype(y, xt))
            wide = relax.op.power(relax.op.astype(x, "float64"), relax.op.astype(y, "float64"))
            return relax.op.astype(relax.op.trunc(wide), xt)

    class _Pairwise(Fixed):
        """Variadic Max/Min/Sum/Mean over tensors folded pairwise with the broadcasting binary op. The stock
        converter broadcasts every input to the common shape, stacks them and reduces the new axis: for XGLM's
        ``max(scores + mask, finfo.min)`` that is a [2, B, H, S, S] tensor, and the attention matcher never
        sees the binary ``maximum`` it can reason about."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            if len(inputs) < 2 or all(isinstance(v, tvm.ir.GenericConst) for v in inputs):
                return stock(bb, inputs, attr, params)
            inputs = list(inputs)
            if any(tvm.ir.is_prim_expr(v) for v in inputs) and any(isinstance(v, relax.Expr) for v in inputs):
                # a size kept as a bare scalar (``Shape → Squeeze``) beside a tensor: DeBERTa's dynamic export
                # takes min(seq, span); TVM's legalisation of a scalar-tensor pair crashed
                inputs = [scalar_tensor(bb, v) if tvm.ir.is_prim_expr(v) else v for v in inputs]
            return cls._impl_dynamic(bb, inputs)

    class Max(_Pairwise, of.Max):
        pass

    class Min(_Pairwise, of.Min):
        pass

    class Sum(_Pairwise, of.Sum):
        pass

    class Mean(_Pairwise, of.Mean):
        pass

    class _FoldedUnary(Fixed):
        """Computed on the spot when the input is a constant. Exporters write size arithmetic in floats (MobileViT's
        ``int(math.ceil(h / p) * p)``: ``Ceil(2.0) · 2.0 → Cast → Div ...`` into a Reshape target); TVM's binary
        and Cast converters fold constants but its unary ones do not, so one ``ceil`` left the Reshape target a
        run-time tensor, which its Reshape converter refuses."""

        numpy_fn = None

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            x = inputs[0] if len(inputs) == 1 else None
            if isinstance(x, tvm.ir.GenericConst) and x.value.numpy().size <= 1024:
                value = x.value.numpy()
                with np.errstate(all="ignore"):
                    return relax.const(cls.numpy_fn(value).astype(value.dtype), str(value.dtype))
            if isinstance(x, tvm.tirx.FloatImm):  # a size computed in floats, folded to a literal by now
                with np.errstate(all="ignore"):
                    return tvm.tirx.FloatImm(str(x.ty), float(cls.numpy_fn(np.float64(x.value))))
            if cls.__name__ in ("Ceil", "Floor") and tvm.ir.is_prim_expr(x) and str(x.ty).startswith("float"):
                rounded = rounded_size_quotient(x, up=cls.__name__ == "Ceil")
                if rounded is not None:
                    return rounded
            return stock(bb, inputs, attr, params)

    folded = []
    for name, fn in (("Ceil", np.ceil), ("Floor", np.floor), ("Round", np.round), ("Sqrt", np.sqrt),
                     ("Neg", np.negative), ("Abs", np.abs), ("Reciprocal", np.reciprocal), ("Exp", np.exp),
                     ("Log", np.log), ("Sign", np.sign)):
        if hasattr(of, name):
            folded.append(type(name, (_FoldedUnary, getattr(of, name)), {"numpy_fn": staticmethod(fn)}))

    return {cls.__name__: cls for cls in (Einsum, IsInf, BitShift, Mod, Equal, Pow, Max, Min, Sum, Mean, *folded)}
