"""Reshapes whose element counts are equal only for some input sizes: checked equal at run time.

An export may reshape a length it computed from an input dim, valid only when that dim divides evenly:
Pegasus-X's dynamic export views its ``[batch, seq]`` mask as ``[batch, seq // 4, 4]``. With ``seq = 13`` the file
is invalid there (ONNX Runtime refuses: the element counts differ), and Relax, which cannot know it, views the 13
elements as 12: a wrong answer. Where TVM's analyzer cannot prove the counts equal, the input is first viewed as
one flat row and match-cast to the new count, so the VM compares the two on every call
(``deploy/io.shape_check_error`` turns its failure into a one-line error naming the inputs). Provably equal
reshapes (every head split, every static one) get nothing. Runs in :func:`~tvm_fusion_ext.compile.lower.lower`,
after fusion, so it also covers what no rule fused.
"""

from __future__ import annotations

import tvm
from tvm import relax, sym

from ...transform.graph import dims_product, shape_dims
from ..lowering.mutation import mutate_functions


@relax.expr_functor.mutator
class _CheckReshapes(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.changed = 0
        self.analyzer = sym.Analyzer()

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.reshape":
            return call
        x = call.args[0]
        old, new = shape_dims(x), getattr(call.args[1], "values", None)
        if not old or new is None or all(isinstance(d, int) for d in old) and \
                all(isinstance(d, tvm.tirx.IntImm) for d in new):
            return call  # unknown shapes, or static ones (Relax already refuses a static mismatch)
        count = dims_product(old)
        wanted = dims_product([int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in new])
        if isinstance(count, int) and isinstance(wanted, int) or \
                self.analyzer.can_prove_equal(_expr(count), _expr(wanted)):
            return call
        flat = self.builder_.emit(relax.op.reshape(x, [count]))
        checked = self.builder_.match_cast(flat, relax.TensorType([wanted], str(x.ty.dtype)))
        self.changed += 1
        return relax.op.reshape(checked, call.args[1])


def _expr(d):
    return tvm.tirx.IntImm("int64", d) if isinstance(d, int) else d


def CheckReshapeSizes() -> tvm.transform.Pass:  # noqa: N802
    """Check at run time the element counts of reshapes not provably size-preserving (the module docstring)."""

    @tvm.transform.module_pass(opt_level=0, name="tfx.CheckReshapeSizes")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return mutate_functions(mod, _CheckReshapes(mod))

    return _pass
