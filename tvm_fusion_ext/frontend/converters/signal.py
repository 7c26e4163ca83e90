"""ONNX ``DFT`` (opsets 17 and 20) as two real matrix products: TVM 0.27 has no converter for it.

FNet mixes tokens with a 2-D Fourier transform instead of attention (``torch.fft.fftn`` over the sequence and
the hidden axes, real part kept); torch's dynamo exporter writes it as two ``DFT`` nodes on ``[..., 2]``
(real, imaginary) tensors. Along an axis of length n, ``X[k] = Σ_j x[j]·e^(∓2πi·jk/n)``; with ``x = a + ib`` and
``θ = 2π·jk/n``:

    forward   Re X = a·cos θ + b·sin θ       Im X = b·cos θ − a·sin θ
    inverse   Re X = (a·cos θ − b·sin θ)/n   Im X = (b·cos θ + a·sin θ)/n

``cos θ`` and ``sin θ`` are ``[n, m]`` matrices (m = n, or ``n//2 + 1`` for a one-sided transform), built from
``jk mod n`` so that the angle stays below 2π in float32: constants when n is static, computed once per call
from the run-time length when it is symbolic. The transform axis is moved last for the products and back after.
Refused in one line: a ``dft_length`` other than the axis length (zero-padding or cropping), an axis computed at
run time, the complex axis as the transform axis, a one-sided inverse (irfft), non-float input.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import Unsupported
from .common import dim_text, is_static


def convert_onnx_dft(bb, data, dft_length, axis: int, inverse: bool, onesided: bool):
    """The ``[..., 2]`` transform of ``data`` (``[..., 1]`` real or ``[..., 2]`` complex) along ``axis``."""
    import tvm
    from tvm import relax

    ty = getattr(data, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise Unsupported("the input's shape is unknown at import")
    dtype = str(ty.dtype)
    if not dtype.startswith("float"):
        raise Unsupported(f"input dtype {dtype} (a float tensor is needed)")
    dims = list(ty.shape.values)
    rank = len(dims)
    if rank < 2 or not is_static(dims[-1]) or int(dims[-1]) not in (1, 2):
        raise Unsupported(f"the last axis has {dim_text(dims[-1]) if dims else '?'} elements (1: real, 2: complex)")
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank - 1:
        raise Unsupported(f"axis {axis} is not a signal axis of a rank-{rank} input (the last holds re/im)")
    n = dims[axis]
    if dft_length is not None:
        if not isinstance(dft_length, tvm.ir.GenericConst):
            raise Unsupported("dft_length is computed at run time")
        length = int(dft_length.value.numpy().reshape(()))
        if not (is_static(n) and length == int(n)):
            raise Unsupported(f"dft_length {length} differs from the axis length {dim_text(n)} (padding or cropping)")
    if onesided and inverse:
        raise Unsupported("a one-sided inverse DFT (irfft) is not implemented")
    if onesided and int(dims[-1]) != 1:
        raise Unsupported("a one-sided DFT of a complex input (ONNX defines it for real input only)")

    # [..., n, ..., re/im] -> re, im as [..., n] with the transform axis last
    order = [a for a in range(rank - 1) if a != axis] + [axis]
    parts = [bb.normalize(relax.op.take(data, relax.const(c, "int64"), axis=rank - 1)) for c in range(int(dims[-1]))]
    re, im = [bb.normalize(relax.op.permute_dims(p, order)) for p in parts] + [None] * (2 - len(parts))
    m = (n // 2 + 1) if onesided else n
    cos, sin = _twiddles(bb, n, m, dtype)

    def mm(x, w):
        return bb.normalize(relax.op.matmul(x, w))

    if im is None:  # a real signal: b = 0
        out_re, out_im = mm(re, cos), mm(re, sin)
        out_im = out_im if inverse else bb.normalize(relax.op.negative(out_im))
    else:
        ac, bs, bc, as_ = mm(re, cos), mm(im, sin), mm(im, cos), mm(re, sin)
        out_re = bb.normalize(relax.op.subtract(ac, bs) if inverse else relax.op.add(ac, bs))
        out_im = bb.normalize(relax.op.add(bc, as_) if inverse else relax.op.subtract(bc, as_))
    if inverse:
        scale = _reciprocal(bb, n, dtype)
        out_re, out_im = (bb.normalize(relax.op.multiply(x, scale)) for x in (out_re, out_im))
    back = [order.index(a) for a in range(rank - 1)]
    out_re, out_im = (bb.normalize(relax.op.expand_dims(relax.op.permute_dims(x, back), rank - 1))
                      for x in (out_re, out_im))
    return relax.op.concat([out_re, out_im], axis=rank - 1)


def _twiddles(bb, n, m, dtype: str):
    """``cos(2π·(jk mod n)/n)`` and ``sin(...)`` as ``[n, m]`` matrices."""
    from tvm import relax

    if is_static(n):
        n, m = int(n), int(m)
        r = np.outer(np.arange(n, dtype=np.int64), np.arange(m, dtype=np.int64)) % n
        angle = 2.0 * math.pi * r.astype(np.float64) / n
        return relax.const(np.cos(angle).astype(dtype)), relax.const(np.sin(angle).astype(dtype))
    j = bb.normalize(relax.op.reshape(relax.op.arange(0, n, 1, "int64"), relax.ShapeExpr([n, 1])))
    k = bb.normalize(relax.op.reshape(relax.op.arange(0, m, 1, "int64"), relax.ShapeExpr([1, m])))
    length = bb.normalize(relax.op.shape_to_tensor(relax.ShapeExpr([n])))
    r = bb.normalize(relax.op.floor_mod(relax.op.multiply(j, k), length))
    angle = bb.normalize(relax.op.divide(relax.op.multiply(relax.op.astype(r, "float64"),
                                                           relax.const(2.0 * math.pi, "float64")),
                                         relax.op.astype(length, "float64")))
    angle = bb.normalize(relax.op.astype(angle, dtype))
    return bb.normalize(relax.op.cos(angle)), bb.normalize(relax.op.sin(angle))


def _reciprocal(bb, n, dtype: str):
    from tvm import relax

    if is_static(n):
        return relax.const(np.asarray(1.0 / int(n), dtype))
    length = bb.normalize(relax.op.astype(relax.op.shape_to_tensor(relax.ShapeExpr([n])), dtype))
    return bb.normalize(relax.op.divide(relax.const(1.0, dtype), length))


def converters():
    """``{"DFT": converter}`` for the importer's map (TVM 0.27 has none for this op)."""
    import tvm
    from tvm.relax.frontend.onnx import onnx_frontend as of

    def flag(attr, name):
        return bool(int(attr.get(name, 0)))

    class DFT(of.OnnxOpConverter):
        @classmethod
        def _impl_v17(cls, bb, inputs, attr, params):
            length = inputs[1] if len(inputs) > 1 else None
            return convert_onnx_dft(bb, inputs[0], length, int(attr.get("axis", 1)), flag(attr, "inverse"),
                                    flag(attr, "onesided"))

        @classmethod
        def _impl_v20(cls, bb, inputs, attr, params):
            length = inputs[1] if len(inputs) > 1 else None
            axis = -2
            if len(inputs) > 2 and inputs[2] is not None:
                if not isinstance(inputs[2], tvm.ir.GenericConst):
                    raise Unsupported("the axis is computed at run time")
                axis = int(inputs[2].value.numpy().reshape(()))
            return convert_onnx_dft(bb, inputs[0], length, axis, flag(attr, "inverse"), flag(attr, "onesided"))

    return {"DFT": DFT}
