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

from typing import List, Tuple

from . import size_factors
from ...errors import ModelLoadError
from .attention import dim_text


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
