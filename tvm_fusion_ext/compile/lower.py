"""Lowering: Relax (fused or not) → Relax calling TIR PrimFuncs, none of them scheduled yet.

:func:`lower` is the only way a module reaches TIR in this package: the tuner extracts its tasks from
``lower(mod, target)`` and the build schedules ``lower(mod, target)``, so a tuning record always finds its
workload again. Order: safety rewrites and library dispatch, operator calls re-derived for the target's
templates (:class:`PrepareOperatorsForTemplates`), the stock legalize/fuse passes, CPU math rewrites
(:func:`VectorisableMath`), then reshape-to-view rewriting so that pure reshapes never become kernels (nor
tuning tasks).
"""

from __future__ import annotations

from typing import Optional

import tvm
from tvm import relax

from ..ops.registry import OperatorCall, call_op, inputs_of, op_of, params_of
from ..targets import TargetInfo, TargetSpec, resolve_target


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

    def _constant(self, expr):
        if isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            expr = bound if bound is not None else expr
        return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if call.op != tvm.ir.Op.get("relax.call_tir") or not isinstance(call.args[0], relax.GlobalVar):
            return call
        func = self.mod[call.args[0]]
        op = op_of(func) if isinstance(func, tvm.tirx.PrimFunc) else None
        if op is None:
            return call
        inputs = dict(zip(inputs_of(func), call.args[1].fields))
        constants = {n: v for n, v in ((n, self._constant(e)) for n, e in inputs.items()) if v is not None}
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
                                 kernel_knobs=None) -> tvm.transform.Pass:
    """Re-derive fused-operator calls with the parameters the target's templates ask for (pre-packed CPU dense
    weights, the tensor-core attention's key block): see ``TemplateRule.prepare_operator``. ``knobs`` and
    ``kernel_knobs`` as in :func:`~tvm_fusion_ext.schedules.registry.template_rules` (a row tile knob pads
    run-time rows here)."""
    from ..schedules.registry import template_rules

    templates = template_rules(target, knobs, kernel_knobs)  # here: a bad knob is a one-line error, not a TVM one

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


def VectorisableMath(target: tvm.target.Target) -> tvm.transform.Pass:  # noqa: N802
    """CPU: fp32 ``erf``/``exp``/``sigmoid``/``tanh`` -> the arithmetic forms of :mod:`..ops.fastmath`. LLVM
    lowers them to one scalar libm call per lane, which made a stock erf-GELU epilogue cost as much as its
    GEMM and MiniLM's softmax (12×128×128) take over a millisecond."""
    import tvm_ffi

    from ..ops.fastmath import REPLACEMENTS

    ops = {tvm.ir.Op.get(name): fn for name, fn in REPLACEMENTS.items()}

    def rewrite(call):
        if isinstance(call.op, tvm.ir.Op):
            for op, fn in ops.items():
                if call.op.same_as(op):
                    return fn(call.args[0])
        return call

    @tvm.transform.module_pass(opt_level=0, name="tfx.VectorisableMath")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not TargetInfo.of(target).is_cpu:
            return mod
        out = None
        for gv, func in list(mod.functions_items()):
            if isinstance(func, tvm.tirx.PrimFunc):
                new = tvm_ffi.structural_map(func, (tvm.ir.expr.Call, rewrite))
                if not new.same_as(func):
                    out = out if out is not None else mod.clone()  # a Python module pass gets the caller's module
                    out[gv] = new
        return out if out is not None else mod

    return _pass


def ShapeDefinitionsFirst() -> tvm.transform.Pass:  # noqa: N802
    """Move each ``match_cast`` that defines a symbolic dim, with what it needs, ahead of the other bindings.

    ``FuseOps`` emits a fused group where its first member was. A data-dependent length (``Range`` to a computed
    bound: the importer's ``range_len_0``) is defined by a ``match_cast`` in the middle of the block; an
    elementwise chain that starts before it and ends in ops over ``[range_len_0]`` then became one group emitted
    before the length exists, and the VM build failed ("range_len_0 has not been computed"; ONNX's window
    functions). With the definitions first, every group starts after them."""

    @tvm.transform.module_pass(opt_level=0, name="tfx.ShapeDefinitionsFirst")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        out = None
        for gv, func in list(mod.functions_items()):
            if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
                known = {v for p in func.params for v in relax.analysis.definable_tir_vars_in_type(p.ty)}
                blocks = [_definitions_first(b, known) for b in func.body.blocks]
                if any(not new.same_as(old) for new, old in zip(blocks, func.body.blocks)):
                    body = relax.SeqExpr(blocks, func.body.body)
                    out = out if out is not None else mod.clone()
                    out[gv] = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)
        return out if out is not None else mod

    return _pass


def _definitions_first(block, known):
    """``block`` with the ``match_cast`` bindings that define a dim not in ``known`` (the parameters' dims) moved
    ahead, each after what it reads; unchanged when they are already a prefix."""
    if not isinstance(block, relax.DataflowBlock):
        return block
    bindings = list(block.bindings)
    index = {b.var: i for i, b in enumerate(bindings)}
    defining = [i for i, b in enumerate(bindings) if isinstance(b, relax.MatchCast)
                and any(v not in known for v in relax.analysis.definable_tir_vars_in_type(b.ty))]
    if not defining:
        return block
    first, seen = [], set()

    def need(i):  # the binding and, before it, every binding of this block it reads
        if i in seen:
            return
        seen.add(i)
        for v in relax.analysis.free_vars(bindings[i].value):
            if v in index:
                need(index[v])
        first.append(i)

    for i in defining:
        need(i)
    if first == list(range(len(first))):
        return block
    order = first + [i for i in range(len(bindings)) if i not in seen]
    return relax.DataflowBlock([bindings[i] for i in order], block.span)


def ReshapesAsViews() -> tvm.transform.Pass:  # noqa: N802  (TVM pass naming)
    """TVM's ``RewriteDataflowReshape`` (reshape kernels → free views), or nothing where TVM's own check of a
    kernel fails. Its iter-map analysis asserts on some symbolic reshapes (Pegasus-X's dynamic export:
    ``[B, seq + 4, 16] → [B, (seq + 4) · 4, 4]``: "the padding factor ... is not divisible"), an internal error
    that read as a crash. The pass only saves copies: without it each reshape stays a copy kernel."""

    def _transform(mod, _ctx):
        try:
            return relax.transform.RewriteDataflowReshape()(mod)
        except tvm.error.InternalError as err:
            if "padding factor" not in str(err):
                raise
            return mod

    return tvm.transform.module_pass(_transform, opt_level=0, name="tfx.ReshapesAsViews")


def lower(mod: tvm.IRModule, target: TargetSpec = None, knobs: Optional[dict] = None,
          kernel_knobs=None) -> tvm.IRModule:
    """Relax (fused by SemanticFusion or not) -> Relax calling unscheduled TIR PrimFuncs, for ``target``.
    ``knobs`` / ``kernel_knobs``: the template knobs the build will schedule with, for the operator parameters
    they decide (see :func:`PrepareOperatorsForTemplates`); the tuner lowers with neither."""
    from ..transform.safe_gather import ClampGatherIndices
    from ..transform.shape_computations import ResolveShapeComputations
    from .gather_checks import CheckGatherIndices
    from .low_precision import AccumulateInFloat32
    from .matmul_checks import CheckMatmulReductions
    from .reshape_checks import CheckReshapeSizes
    from .scalar_calls import KeepScalarCallsUnfused
    from .split_kernel import LEGALIZE

    target = resolve_target(target)
    passes = [
        ResolveShapeComputations(),  # an unfused dynamic-axis export still needs its lengths tied to its inputs
        CheckGatherIndices(),  # a bad token id, or a mask shorter than the cache, is refused, not read past
        ClampGatherIndices(),  # and a take never reads past its table, whoever calls the VM
        CheckMatmulReductions(),  # nor a length the export named apart past the other operand
        CheckReshapeSizes(),  # nor a reshape valid only for some lengths view the wrong number of elements
        AccumulateInFloat32(),  # stock fp16 matmuls/convolutions sum in float32, as ours do
        relax.backend.DispatchSampling(),
        relax.backend.DispatchSortScan(),
        PrepareOperatorsForTemplates(target, knobs, kernel_knobs),
        relax.transform.LegalizeOps(customize_legalize_map=LEGALIZE),  # equal splits: one kernel
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        # exporters rebuild the same mask (or position table) inside every layer: once is enough
        relax.transform.EliminateCommonSubexpr(),
        KeepScalarCallsUnfused(),
        ShapeDefinitionsFirst(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        VectorisableMath(target),
        ReshapesAsViews(),
        relax.transform.DeadCodeElimination(),
    ]
    with target:
        return tvm.transform.Sequential(passes, name="tfx.lower")(mod)
