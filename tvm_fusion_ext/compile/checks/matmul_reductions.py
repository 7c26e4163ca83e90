"""Matmuls whose two reduction lengths are different symbols: checked equal at run time.

Relax infers ``matmul(x [.., n], y [m, ..])`` when ``n`` and ``m`` are not provably different, and its kernel
then loops over ``n`` and indexes ``y`` with it. An export that names two lengths apart which the graph ties
together (``past_key`` and ``past_value`` of a KV cache, concatenated with the new keys and values and
multiplied over by the attention's second matmul) compiled, and with ``n > m`` read past ``y``'s end: a wrong
answer or garbage, where ONNX Runtime refuses. Match-casting ``y`` to ``x``'s length makes the VM compare the two
on every call (``deploy/io.shape_check_error`` turns its failure into a one-line error naming the inputs).
Runs in :func:`~tvm_fusion_ext.compile.lower.lower`, after fusion, so it also covers what no rule fused.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ...transform.graph import same_dim, shape_dims
from ..lowering.mutation import mutate_functions


@relax.expr_functor.mutator
class _CheckReductions(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.changed = 0

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.matmul":
            return call
        x, y = call.args[0], call.args[1]
        xs, ys = shape_dims(x), shape_dims(y)
        if not xs or not ys:
            return call
        axis = len(ys) - 2 if len(ys) >= 2 else 0
        if same_dim(xs[-1], ys[axis]):
            return call
        if isinstance(xs[-1], int) and isinstance(ys[axis], int):
            return call  # two different sizes: relax already refuses that matmul
        dims = list(ys)
        dims[axis] = xs[-1]
        checked = self.builder_.match_cast(y, relax.TensorType(dims, str(y.ty.dtype)))
        self.changed += 1
        return relax.op.matmul(x, checked, out_dtype=call.attrs.out_dtype)


def CheckMatmulReductions() -> tvm.transform.Pass:  # noqa: N802
    """Match-cast a matmul's right operand to its left operand's reduction length where the two differ
    symbolically (see the module docstring)."""

    @tvm.transform.module_pass(opt_level=0, name="tfx.CheckMatmulReductions")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return mutate_functions(mod, _CheckReductions(mod))

    return _pass
