"""QuantizeLinear as ONNX Runtime computes it: a NaN quantizes to the integer type's lowest value (the stock lowering
clamps it to the highest)."""

from __future__ import annotations

from typing import Dict

import numpy as np

from .common import Fixed, dtype_of, ndim_of


def converters() -> Dict[str, type]:
    """``{op name: converter class}`` of this family, to lay over TVM's converter map."""
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as of

    class QuantizeLinear(Fixed, of.QuantizeLinear):
        """``x / scale`` that is NaN quantizes to the integer type's lowest value, as ONNX Runtime does (its x86
        conversion gives the "integer indefinite" value, saturated to the lowest). The stock lowering clamps a NaN
        to the highest. ``onnxruntime.quantization.quantize_static`` calibrates BERT's additive mask (0 or
        ``finfo.min``) to scale = inf, so a masked score is ``-inf / inf`` there: with the highest value a masked
        key came back as ``+inf`` and the output was another one (max difference 2.5 on a tiny MiniLM, against
        ONNX Runtime with its optimizations off). One TE compute that reads ``x`` once (a ``Let``): a NaN test
        beside the stock op read it twice, and through a fused chain of quantized residual adds the inlined
        expression doubled at every level (the build never finished)."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            from tvm import te, tirx

            x, scale = inputs[0], inputs[1]
            zp = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
            dtype = dtype_of(zp) if zp is not None else "uint8"
            if not dtype.startswith(("int", "uint")) or dtype_of(x) not in ("float32", "float16", "float64") \
                    or ndim_of(scale) > 1 or (zp is not None and ndim_of(zp) > 1):
                return stock(bb, inputs, attr, params)  # float8 keeps its NaN; blocked scales are the stock's
            ndim, axis = ndim_of(x), int(attr.get("axis", 1))
            if ndim <= 1 and axis == 1:
                axis = 0
            axis = axis + ndim if axis < 0 else axis
            info = np.iinfo(np.dtype(dtype))
            fdtype = dtype_of(x)
            zp = zp if zp is not None else relax.const(0, dtype)

            def at(t, idx):  # a scalar, or one value per index along ``axis``
                return t[()] if len(t.shape) == 0 else t[idx[axis] if int(t.shape[0]) != 1 else 0]

            def quantize(data, s, z):
                def element(*idx):
                    r = tirx.Var("r", fdtype)
                    lo, hi = tirx.const(float(info.min), fdtype), tirx.const(float(info.max), fdtype)
                    q = tirx.max(tirx.min(tirx.round(r) + at(z, idx).astype(fdtype), hi), lo)
                    return tirx.Let(r, data[idx] / at(s, idx).astype(fdtype),
                                    tirx.Select(tirx.isnan(r), lo, q).astype(dtype))
                return te.compute(data.shape, element, name="quantized")

            return bb.call_te(quantize, x, scale, zp, primfunc_name_hint="quantize_linear")

    return {cls.__name__: cls for cls in (QuantizeLinear,)}
