"""An ONNX Reshape read against the input dims' ranges.

A Reshape must keep the element count. With symbolic dims that is a condition on them, and TVM neither proves
nor checks it: a reshape of ``[seq, batch, 64]`` to ``[20, batch·4, 16]`` builds, and at ``seq = 13`` reads
past its input. Exporters write exactly that when they bake a traced size into a file whose axes they declare
dynamic (the legacy exporter does for ``nn.MultiheadAttention``'s head split: ONNX Runtime fails on such a file
at any other length). So each Reshape's element counts are compared after cancelling the factors both sides
share (``batch``): equal, it is a view at every size; equal for one size of one dim, that dim's range is pinned
to it (a run at another size is then refused in one line, and the manifest says why); equal for no size, the
model is refused. A condition we cannot reduce to one of those is left as TVM leaves it.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from ..errors import ModelLoadError
from .common import Fixed, dim_text, size_factors


def check_reshape_in_range(data, out, ranges, node: str, label: str) -> None:
    """Narrow ``ranges`` (a :class:`~tvm_fusion_ext.frontend.dims.DimRanges`) so that ``reshape(data) -> out`` keeps the
    element count, or raise :class:`ModelLoadError` when no size can."""
    from tvm import relax, tirx

    shapes = [getattr(getattr(x, "ty", None), "shape", None) for x in (data, out)]
    if not all(isinstance(s, relax.ShapeExpr) for s in shapes):
        return
    src, dst = (list(s.values) for s in shapes)
    (c_src, v_src), (c_dst, v_dst) = _cancelled(src, dst)
    what = f"node {node} reshapes [{_dims(src)}] to [{_dims(dst)}]"
    if not v_src and not v_dst:
        if c_src != c_dst:
            raise ModelLoadError(f"{label}: {what}: {c_src} elements into {c_dst}")
        return
    if ranges.proves(_product(src) == _product(dst)):
        return
    if len(v_src) + len(v_dst) != 1 or not isinstance((v_src + v_dst)[0], tirx.Var):
        return  # not one dim times a constant: left as TVM leaves it
    var = (v_src + v_dst)[0]
    name = str(var.name)
    if name not in ranges.vars:
        return
    # c_src · var = c_dst (or c_src = c_dst · var)
    num, den = (c_dst, c_src) if v_src else (c_src, c_dst)
    if num % den or num // den < 1:
        raise ModelLoadError(f"{label}: {what}: no size of {name} keeps the element count")
    size = num // den
    why = f"{what}, as many elements only when {name} = {size} (a size the exporter fixed)"
    pinned = tirx.IntImm("int64", size)
    if not (ranges.require(var <= pinned, why) and ranges.require(var >= pinned, why)):
        raise ModelLoadError(f"{label}: {what}: the element count holds only for {name} = {size}, outside "
                             f"{name}'s range {ranges.lower[name]}..{ranges.upper[name]}")


def _cancelled(src, dst) -> Tuple[Tuple[int, List], Tuple[int, List]]:
    """Each side's (constant factor, symbolic factors) once the symbolic factors both share are cancelled."""
    import tvm_ffi
    from tvm import tirx

    def split(dims):
        const, syms = 1, []
        for d in dims:
            for f in size_factors(d):
                if isinstance(f, tirx.IntImm):
                    const *= int(f)
                else:
                    syms.append(f)
        return const, syms

    (c_src, v_src), (c_dst, v_dst) = split(src), split(dst)
    rest = []
    for f in v_src:
        match = next((i for i, g in enumerate(v_dst) if tvm_ffi.structural_equal(f, g)), None)
        if match is None:
            rest.append(f)
        else:
            v_dst.pop(match)
    return (c_src, rest), (c_dst, v_dst)


def _product(dims):
    from tvm import tirx

    out = tirx.IntImm("int64", 1)
    for d in dims:
        out = out * d
    return out


def _dims(dims) -> str:
    return ", ".join(dim_text(d) for d in dims)


def _target_with_inferred_dim(data, target, attr):
    """A Reshape target's ``-1`` (and ``0``s, which copy the input's dim) resolved by cancelling the factors the
    input's dims and the other target dims share, for input dims that are symbolic; None where that does not
    resolve it. TVM infers the ``-1`` as ``prod(input) // prod(others)`` without cancelling (``L`` may be 0 for
    all it knows), ``batch·L·64 // (16·L)`` for ``[batch, 4, L, 16] → [-1, L, 16]``, and a later pass
    (``RewriteDataflowReshape``) then fails on that quotient (wav2vec2's dynamo export, with L its conv length).
    Dims are at least 1 (the importer's ranges say so), so cancelling a shared factor is exact."""
    import tvm
    import tvm_ffi
    from tvm import relax, tirx

    ty = getattr(data, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = list(ty.shape.values)
    if all(isinstance(d, tirx.IntImm) for d in dims):
        return None
    if isinstance(target, relax.ShapeExpr):
        want = list(target.values)
    elif isinstance(target, tvm.ir.GenericConst) and target.value.numpy().ndim == 1:
        want = [tirx.IntImm("int64", int(v)) for v in target.value.numpy()]
    else:
        return None
    minus_one = [k for k, w in enumerate(want) if isinstance(w, tirx.IntImm) and int(w) == -1]
    zeros = [k for k, w in enumerate(want) if isinstance(w, tirx.IntImm) and int(w) == 0]
    if len(minus_one) != 1 or (zeros and int(attr.get("allowzero", 0))) or any(k >= len(dims) for k in zeros):
        return None
    want = [dims[k] if k in zeros else w for k, w in enumerate(want)]
    num = [f for d in dims for f in size_factors(d)]
    const_den = 1
    for f in (f for k, w in enumerate(want) if k != minus_one[0] for f in size_factors(w)):
        if isinstance(f, tirx.IntImm):
            const_den *= int(f)
            continue
        match = next((i for i, g in enumerate(num) if tvm_ffi.structural_equal(f, g)), None)
        if match is None:
            return None
        num.pop(match)
    const_num = int(np.prod([int(f) for f in num if isinstance(f, tirx.IntImm)]))
    if const_den <= 0 or const_num <= 0 or const_num % const_den:
        return None
    inferred, scale = None, const_num // const_den
    for f in num:
        if not isinstance(f, tirx.IntImm):
            inferred = f if inferred is None else inferred * f
    inferred = tirx.IntImm("int64", scale) if inferred is None else inferred * scale if scale != 1 else inferred
    want[minus_one[0]] = inferred
    return relax.ShapeExpr(want)


def converters() -> Dict[str, type]:
    """``{"Reshape": converter}``: a target computed from sizes, with a ``-1`` inferred by cancelling shared factors."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as of

    class Reshape(Fixed, of.Reshape):
        """A size computed from input dims (the importer keeps ``Squeeze(Shape(x)[0:1]) * 4`` as a scalar
        expression) reshaped to one element: read as the one-dim shape value it is, which the stock converter
        handles like ``Shape``'s output (it refused scalars: BLOOM's dynamic dynamo export)."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            data = inputs[0]
            ty = getattr(data, "ty", None)
            if (not isinstance(data, relax.Var) and isinstance(ty, tvm.ir.PrimType)
                    and str(ty.dtype).startswith(("int", "uint"))):
                size = data if str(ty.dtype) == "int64" else tvm.tirx.Cast("int64", data)
                inputs = [relax.ShapeExpr([size]), *list(inputs)[1:]]
            target = _target_with_inferred_dim(data, inputs[1] if len(inputs) > 1 else None, attr)
            if target is not None:
                return relax.op.reshape(data, target)
            return stock(bb, inputs, attr, params)

    return {"Reshape": Reshape}
