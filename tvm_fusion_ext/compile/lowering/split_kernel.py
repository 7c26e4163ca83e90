"""A ``split`` into equal parts, legalized as one kernel that writes every part.

TVM legalizes ``split`` to one loop nest per part: on CPU each is a parallel region of its own, and at short lengths
the thread pool's fork and join cost more than the copy. A fused QKV projection's split (MiniLM: [rows, 1152] into
three [rows, 384]) ran 13.8 µs at 16 rows as three loop nests and 7.5 µs as one (same VM, 2-core EPYC), and every
layer of every model with a horizontal QKV fusion has one. One loop nest needs parts of one shape (a TE compute's
outputs share their iteration space): equal sections of a static axis. Anything else keeps TVM's legalization.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import tvm
from tvm import relax, te, tirx

_SPLIT = "relax.split"


def equal_parts(call: relax.Call) -> Optional[Tuple[int, List[int]]]:
    """(axis, the parts' starts along it) when every part has the same static size, else None."""
    ty = call.args[0].ty
    if not isinstance(ty, relax.TensorType) or ty.ndim < 1 or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    axis = int(call.attrs.axis) % ty.ndim
    extent = ty.shape.values[axis]
    if not isinstance(extent, tirx.IntImm):
        return None
    extent = int(extent)
    sections = call.attrs.indices_or_sections
    if isinstance(sections, tirx.IntImm):
        n = int(sections.value)
        if n < 2 or extent % n:
            return None
        return axis, [p * (extent // n) for p in range(n)]
    if not all(isinstance(i, tirx.IntImm) for i in sections):
        return None
    bounds = [0] + [int(i) for i in sections] + [extent]
    sizes = {b - a for a, b in zip(bounds, bounds[1:])}
    return (axis, bounds[:-1]) if len(bounds) > 2 and len(sizes) == 1 else None


def _one_loop_nest(x: te.Tensor, starts: List[int], axis: int):
    size = starts[1] - starts[0]
    shape = [size if d == axis else x.shape[d] for d in range(len(x.shape))]

    def parts(*idx):
        return tuple(x[tuple(i + s if d == axis else i for d, i in enumerate(idx))] for s in starts)

    return list(te.compute(shape, parts, name="T_split"))


def legalize_split(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    parts = equal_parts(call)
    if parts is None:
        return tvm.ir.Op.get(_SPLIT).get_attr("FLegalize")(bb, call)
    axis, starts = parts
    return bb.call_te(_one_loop_nest, call.args[0], starts, axis, primfunc_name_hint="split")


#: the ``customize_legalize_map`` entries of :func:`..lower.lower`'s LegalizeOps
LEGALIZE = {_SPLIT: legalize_split}
