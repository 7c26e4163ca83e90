"""ClampGatherIndices: embedding lookups must not read out of bounds on a bad token id.

TVM's ONNX importer lowers ``Gather`` to ``R.take(..., mode="fast")``, which does no bounds check: an id
outside the vocabulary reads (or segfaults on) memory past the table. ``mode="clip"`` clamps ids into range
instead: identical results for every valid id, a defined result (the first or last row) for an invalid one,
and the cost of one min/max per index. An invalid id never gets that far in a build: ``lower`` runs
``compile/checks/gather_indices.py`` first, whose run-time check refuses it in one line, as ONNX Runtime does; this pass
is the guarantee that no read goes past the table whatever calls the kernel.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .graph import op_name


@relax.expr_functor.mutator
class _Clamp(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if op_name(call) == "relax.take" and str(call.attrs.mode) == "fast":
            axis = call.attrs.axis
            return relax.op.take(call.args[0], call.args[1], axis=None if axis is None else int(axis), mode="clip")
        return call


def ClampGatherIndices() -> tvm.transform.Pass:  # noqa: N802
    def _transform(mod, _ctx):
        out = mod.clone()  # a Python module pass gets the caller's module
        for gv, func in list(mod.functions_items()):
            if isinstance(func, relax.Function):
                out[gv] = _Clamp(mod).visit_expr(func)
        return out

    return tvm.transform.module_pass(_transform, opt_level=0, name="tfx.ClampGatherIndices")
