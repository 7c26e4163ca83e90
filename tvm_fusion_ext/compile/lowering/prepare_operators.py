"""Fused-operator calls re-derived with the parameters the target's templates ask for (pre-packed CPU dense
weights, the tensor-core attention's key block), before legalisation turns them into kernels."""

from __future__ import annotations

from typing import List, Optional

import tvm
from tvm import relax

from ...ops.registry import OperatorCall, call_op, params_of
from .operator_calls import bound_constant, operator_call


@relax.expr_functor.mutator
class _PrepareOperators(relax.PyExprMutator):
    """Shows every fused-operator call to the target's templates; the first that wants another call gets it.
    Operators are TE computes, so a new parameter set is a new PrimFunc; the old one is dropped by DCE."""

    def __init__(self, mod: tvm.IRModule, templates, target):
        super().__init__(mod)
        self.mod = mod
        self.templates = templates
        self.target = target
        self.changed = 0

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        found = operator_call(self.mod, call)
        if found is None:
            return call
        op, func, inputs = found
        constants = {n: v for n, v in ((n, bound_constant(self, e)) for n, e in inputs.items()) if v is not None}
        original = OperatorCall(op, inputs, params_of(func), constants)
        for template in self.templates:
            wanted = template.prepare(original, self.target)
            if wanted is not None:
                self.changed += 1
                # a template may ask for an input computed from the given ones (a slice): bound first, typed
                given = {n: self.builder_.emit(e) if isinstance(e, relax.Call) else e for n, e in wanted.inputs.items()}
                return call_op(self.builder_, op, given, wanted.params)
        return call


def PrepareOperatorsForTemplates(target: tvm.target.Target, knobs: Optional[dict] = None,  # noqa: N802
                                 kernel_knobs=None, templates: Optional[List] = None) -> tvm.transform.Pass:
    """Re-derive fused-operator calls with the parameters the target's templates ask for (pre-packed CPU dense
    weights, the tensor-core attention's key block): see ``TemplateRule.prepare_operator``. ``templates``: the
    compilation's template rules (:func:`~tvm_fusion_ext.schedules.registry.template_rules`, built once by
    :func:`~tvm_fusion_ext.compile.pipeline.compile_model` and shared with the scheduler); without them they are
    built here from ``knobs`` and ``kernel_knobs`` (a row tile knob pads run-time rows here)."""
    if templates is None:
        from ...schedules.registry import template_rules

        templates = template_rules(target, knobs, kernel_knobs)  # here: a bad knob is a one-line error, not TVM's

    @tvm.transform.module_pass(opt_level=0, name="tfx.PrepareOperatorsForTemplates")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mutator = _PrepareOperators(mod, templates, target)
        for gv, func in list(mod.functions_items()):
            if isinstance(func, relax.Function):
                mutator.builder_.update_func(gv, mutator.visit_expr(func))
        if not mutator.changed:
            return mod
        return relax.transform.DeadCodeElimination()(mutator.builder_.get())

    return _pass
