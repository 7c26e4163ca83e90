"""Reductions: ReduceMax/ReduceMin of only infinities (TVM starts from the type's finite limit), TopK."""

from __future__ import annotations

from typing import Dict

import numpy as np

from .common import Fixed, dtype_of


def converters() -> Dict[str, type]:
    """``{op name: converter class}`` of this family, to lay over TVM's converter map."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as of

    class TopK(Fixed, of.TopK):
        """``sorted=0`` leaves the order of the k results to the runtime (ONNX), so the sorted order is one valid
        answer; TVM's converter refused the attribute (Doge's dynamic mask picks its kept keys this way)."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            return stock(bb, inputs, {**attr, "sorted": 1}, params)

    class _InfiniteReduction(Fixed):
        """ReduceMax (ReduceMin) of a float tensor whose reduced elements are all -inf (+inf): TOPI starts the
        reduction at the lowest (highest) *finite* value, so it returns that instead of the infinity. Guards that
        test a row for "every key hidden" (ONNX's expanded Attention: ``ReduceMax(bias) == -inf``) then never
        fire. The stock result is kept except where it is that start value and no element equals it."""

        start = "min"      # which end of the float range the stock reduction starts at
        infinity = -np.inf

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            x = inputs[0]
            if not isinstance(getattr(x, "ty", None), relax.TensorType) or not dtype_of(x).startswith("float") \
                    or isinstance(x, tvm.ir.GenericConst):
                return stock(bb, inputs, attr, params)
            dtype = dtype_of(x)
            limit = relax.const(getattr(np.finfo(dtype), cls.start), dtype)
            # resolved once: get_constant takes an initializer out of the parameters as it folds it
            rest = [of.get_constant(v, params) if v is not None else None for v in list(inputs)[1:]]
            out = bb.normalize(stock(bb, [x, *rest], attr, params))
            # the same reduction of an indicator says whether an element *is* the start value: max of "x == it"
            # for ReduceMax, min of "x != it" for ReduceMin; 1 or 0, compared with one half
            flag = relax.op.equal(x, limit) if cls.start == "min" else relax.op.not_equal(x, limit)
            hits = bb.normalize(stock(bb, [relax.op.astype(flag, dtype), *rest], attr, params))
            found = (relax.op.greater if cls.start == "min" else relax.op.less)(hits, relax.const(0.5, dtype))
            only_infinities = relax.op.logical_and(relax.op.equal(out, limit), relax.op.logical_not(found))
            return relax.op.where(only_infinities, relax.const(cls.infinity, dtype), out)

    class ReduceMax(_InfiniteReduction, of.ReduceMax):
        pass

    class ReduceMin(_InfiniteReduction, of.ReduceMin):
        start = "max"
        infinity = np.inf

    return {cls.__name__: cls for cls in (TopK, ReduceMax, ReduceMin)}
