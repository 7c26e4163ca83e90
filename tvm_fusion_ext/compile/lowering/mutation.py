"""One walk for the lowering passes that rewrite calls with a Relax ``PyExprMutator``."""

from __future__ import annotations

from typing import Callable, Optional

import tvm
from tvm import relax


def mutate_functions(mod: tvm.IRModule, mutator, enter: Optional[Callable[[relax.Function], None]] = None):
    """``mutator`` (a ``PyExprMutator`` counting its rewrites in ``changed``) over every Relax function of
    ``mod``, ``enter(func)`` first; the module its builder made, or ``mod`` itself when nothing changed (a
    module no pass touched stays the same object)."""
    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            if enter is not None:
                enter(func)
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get() if mutator.changed else mod
