"""Weights out of the library: large Relax constants of ``main`` become trailing parameters.

An artifact keeps its weights beside the compiled library, not inside it (``tvm-fusion compile``): a library
with MiniLM's 90 MB of constants took 0.36–0.52 s to load (TVM deserialises and copies every constant),
where the lifted library plus its weights file loads in tens of milliseconds (deploy/weights.py), keeps one
copy of the weights in memory instead of two, and has no size limit from the shared object. Lifting happens after
scheduling, so what is lifted is the weights as the kernels read them: pre-packed panels and concatenated
QKV projections, not the ONNX initializers.
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np
import tvm
from tvm import relax

#: Constants smaller than this stay in the library's constant pool: scalars and tiny tables cost nothing to
#: load, and every lifted constant is one more argument per call.
LIFT_MIN_BYTES = 1024
#: ``main``'s attr: how many of its parameters are model inputs (the rest are lifted weights); TVM's name.
NUM_INPUT_ATTR = "num_input"


@relax.expr_functor.mutator
class _ConstantsToParams(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, min_bytes: int):
        super().__init__(mod)
        self.min_bytes = min_bytes
        self.lifted: List[Tuple[relax.Var, tvm.runtime.Tensor]] = []
        self._var_of = {}  # one parameter per constant object, however often it is used

    def visit_generic_const_(self, const):
        value = const.value
        if not isinstance(const.ty, relax.TensorType) or _nbytes(value) < self.min_bytes:
            return const
        var = self._var_of.get(const)
        if var is None:
            var = relax.Var(f"weight_{len(self.lifted)}", const.ty)
            self._var_of[const] = var
            self.lifted.append((var, value))
        return var


def _nbytes(tensor) -> int:
    return int(np.prod([int(d) for d in tensor.shape], dtype=np.int64)) * tvm.runtime.DataType(str(tensor.dtype)).bits // 8


def lift_weights(mod: tvm.IRModule, min_bytes: int = LIFT_MIN_BYTES) -> Tuple[tvm.IRModule, List[Tuple[str, np.ndarray]]]:
    """``main``'s constants of ``min_bytes`` or more → parameters after the inputs, in first-use order.

    Returns the new module (``main`` gains the attr ``num_input``) and ``[(parameter name, value)]``; call the
    built ``main`` with the inputs followed by these values. A constant used several times is one parameter.
    Other functions keep their constants. The caller's module is not changed."""
    main = mod["main"]
    mutator = _ConstantsToParams(mod, min_bytes)
    body = mutator.visit_expr(main.body)
    if not mutator.lifted:
        return mod, []
    params = list(main.params) + [var for var, _ in mutator.lifted]
    new_main = relax.Function(params, body, main.ret_ty, main.is_pure, main.attrs, main.span)
    new_main = new_main.with_attr(NUM_INPUT_ATTR, len(main.params))
    out = mod.clone()
    out["main"] = new_main
    return out, [(var.name, value.numpy()) for var, value in mutator.lifted]
