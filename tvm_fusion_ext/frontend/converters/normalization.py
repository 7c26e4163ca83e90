"""Normalization at inference: LayerNormalization's Mean/InvStdDev outputs, RMSNormalization over every axis,
and Dropout's mask output (training mode is refused before importing, :mod:`..checks`)."""

from __future__ import annotations

from typing import Dict

from .common import Fixed, dtype_of, ndim_of


def converters() -> Dict[str, type]:
    """``{op name: converter class}`` of this family, to lay over TVM's converter map."""
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as of

    class LayerNormalization(Fixed, of.LayerNormalization):
        """The optional Mean and InvStdDev outputs (the stock converter returns two scalar zeros for them)."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            out = stock(bb, inputs, attr, params)
            if attr["tvm_custom"]["num_outputs"] < 2:
                return out
            x = inputs[0]
            ndim = ndim_of(x)
            axis = int(attr.get("axis", -1)) % ndim
            axes = list(range(axis, ndim))
            stash = of.get_type(int(attr.get("stash_type", 1)))
            xs = relax.op.astype(x, stash) if dtype_of(x) != stash else x
            mean = bb.emit(relax.op.mean(xs, axes, keepdims=True))
            centred = bb.emit(relax.op.subtract(xs, mean))
            var = relax.op.mean(relax.op.multiply(centred, centred), axes, keepdims=True)
            inv = relax.op.rsqrt(relax.op.add(var, relax.const(float(attr.get("epsilon", 1e-5)), stash)))
            return relax.Tuple([out[0], mean, bb.emit(inv)])

    class RMSNormalization(Fixed, of.RMSNormalization):
        """Normalising over every axis (``axis`` 0 or ``-rank``): TOPI's ``rms_norm`` fails to build then ("Tensor
        dimension mismatch"), so that case is written out as x * rsqrt(mean(x^2) + eps) * scale."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            x, scale = inputs[0], inputs[1]
            ndim = ndim_of(x)
            if int(attr.get("axis", -1)) % ndim != 0:
                return stock(bb, inputs, attr, params)
            out_type = dtype_of(x)
            stash = "float32" if int(attr.get("stash_type", 1)) == 1 else out_type
            xs = relax.op.astype(x, stash) if out_type != stash else x
            ss = relax.op.astype(scale, stash) if dtype_of(scale) != stash else scale
            ms = relax.op.mean(relax.op.multiply(xs, xs), list(range(ndim)), keepdims=True)
            inv = relax.op.rsqrt(relax.op.add(ms, relax.const(float(attr.get("epsilon", 1e-5)), stash)))
            y = relax.op.multiply(relax.op.multiply(xs, inv), ss)
            return relax.op.astype(y, out_type) if stash != out_type else y

    class Dropout(Fixed, of.Dropout):
        """The optional mask output: all true at inference (the stock converter gives relax's float mask)."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            out = stock(bb, inputs, attr, params)
            if attr["tvm_custom"]["num_outputs"] < 2:
                return out
            out = bb.normalize(out)
            y = bb.emit(relax.TupleGetItem(out, 0)) if isinstance(out.ty, relax.TupleType) else out
            return relax.Tuple([y, relax.op.ones_like(inputs[0], "bool")])

    return {cls.__name__: cls for cls in (LayerNormalization, RMSNormalization, Dropout)}
