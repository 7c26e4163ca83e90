"""ONNX ``Pad`` (constant mode) whose widths are computed from a symbolic dim.

Models that work in fixed-size blocks pad the sequence up to a whole block: Longformer's sliding window pads to
a multiple of the window, ``(w - seq % w) % w`` zeros after the tokens. Exported with a dynamic sequence, the pad
widths are computed from ``Shape`` at run time, and TVM's converter takes constant widths only ("Dynamic pads are
not supported yet"). Here the widths are evaluated as expressions of the input dims (see
:mod:`..symbolic_values`) and, once each is shown ``>= 0`` over the dims' ranges, the pad is written as the
concatenation it is: a block of the pad value before and after the data along each padded axis, whose sizes are
those expressions. A computed width not shown ``>= 0`` (ONNX crops with negative ones) becomes a gather that pads
or crops by the width's sign at run time; the ``edge``/``reflect``/``wrap`` modes stay with TVM's converter, which
refuses computed widths, in one line.
"""

from __future__ import annotations

from ..errors import Unsupported
from .common import dim_text, int_elements, is_static


def convert_pad_in_range(bb, inputs, attrs, ranges, node: str):
    """The padded tensor for one ONNX Pad node (opset 11+), or None where TVM's converter is right as it is
    (widths known at import, another mode, an input of unknown rank)."""
    from tvm import relax, tirx

    inputs = list(inputs) + [None] * (4 - len(inputs))
    data = inputs[0]
    mode = attrs.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode != "constant" or not isinstance(getattr(data, "ty", None), relax.TensorType) or data.ty.shape is None:
        return None
    pads = int_elements(bb, inputs[1])
    if pads is None or all(is_static(p) for p in pads):
        return None
    dims = list(data.ty.shape.values)
    axes = int_elements(bb, inputs[3]) if inputs[3] is not None else \
        [tirx.IntImm("int64", a) for a in range(len(dims))]
    if axes is None or not all(is_static(a) for a in axes) or len(pads) != 2 * len(axes):
        raise Unsupported(f"pads {[dim_text(p) for p in pads]} do not pair with axes over rank {len(dims)}")
    value = _pad_value(inputs[2], str(data.ty.dtype))
    out = data
    for i, axis in enumerate(int(a) % len(dims) for a in axes):
        for where, width in (("before", pads[i]), ("after", pads[len(axes) + i])):
            width = ranges.simplify(width)
            if is_static(width) and int(width) == 0:
                continue
            if not ranges.proves(width >= 0):
                out = _pad_or_crop(bb, out, axis, width, where, value)
                continue
            shape = list(out.ty.shape.values)
            shape[axis] = width
            block = bb.normalize(relax.op.full(relax.ShapeExpr(shape), value, str(data.ty.dtype)))
            parts = [block, out] if where == "before" else [out, block]
            out = bb.normalize(relax.op.concat(parts, axis=axis))
    return out


def _pad_or_crop(bb, x, axis: int, width, where: str, value):
    """``x`` with ``width`` slots added ``where`` along ``axis`` when ``width >= 0`` at run time, cropped by
    ``-width`` when negative (ONNX's reading of a negative pad). For widths the analyzer cannot sign:
    SEW's ``seq // 10 - (seq - 10) // 20 * 2 - 1`` is 0 or 1 for every length, but floor divisions defeat the
    proof. Output slot ``i`` reads ``x[i - before]`` where that is inside ``x``, else the pad value: one gather
    and one select, whatever the sign."""
    from tvm import relax, tirx

    dims = list(x.ty.shape.values)
    length = dims[axis]
    before = width if where == "before" else tirx.IntImm("int64", 0)
    out_len = length + width
    source = bb.normalize(relax.op.arange(-before, out_len - before, 1, "int64"))
    limit = relax.op.shape_to_tensor(relax.ShapeExpr([length]))  # [length], as a tensor to compare with
    inside = bb.normalize(relax.op.logical_and(relax.op.greater_equal(source, relax.const(0, "int64")),
                                               relax.op.less(source, limit)))
    safe = bb.normalize(relax.op.where(inside, source, relax.const(0, "int64")))
    gathered = bb.normalize(relax.op.take(x, safe, axis=axis))
    keep = [1] * len(dims)
    keep[axis] = out_len
    keep = bb.normalize(relax.op.reshape(inside, relax.ShapeExpr(keep)))
    return bb.normalize(relax.op.where(keep, gathered, value))


def _pad_value(x, dtype: str):
    import tvm
    from tvm import relax

    if x is None:
        return relax.const(0, dtype)
    if not isinstance(x, tvm.ir.GenericConst):
        raise Unsupported("the pad value is computed at run time (a constant is needed)")
    return relax.const(x.value.numpy().reshape(()).item(), dtype)
