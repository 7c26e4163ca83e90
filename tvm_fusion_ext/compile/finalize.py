"""The last step: a scheduled module → a TVM executable, with the backend's own dataflow-lowering and
finalisation passes only. Legalisation, fusion and scheduling have happened already (the stock CPU
``tvm.compile`` pipeline would do no fusion and no scheduling at all).

Ours around the backend's (:mod:`.codegen`): CPU weight prefetch and stacked accumulators
(:mod:`.codegen.weight_prefetch`, before and inside TIR lowering), parallel loops of run-time extent kept serial
for small calls (:mod:`.codegen.serial_when_small`), the guarded reshape-to-view rewrite
(:mod:`.lowering.reshape_views`), shape values computed once (:mod:`.codegen.shape_reuse`) and ``noalias``
shape functions (:mod:`.codegen.shape_functions`)."""

from __future__ import annotations

import tvm

from ..targets import TargetInfo


def finalize_pipeline(target: tvm.target.Target) -> tvm.transform.Pass:
    if TargetInfo.of(target).is_cuda:
        from tvm.relax.backend.cuda import pipeline as backend
    else:
        from tvm.relax.backend.cpu_generic import pipeline as backend
    from .codegen.shape_functions import ShapeFunctionsNoAlias
    from .codegen.shape_reuse import ReuseShapeValues
    from .lowering.reshape_views import ReshapesAsViews

    # the backend runs RewriteDataflowReshape again: the same guard against TVM's assertion (see ReshapesAsViews)
    passes = [ReshapesAsViews() if p.info.name == "RewriteDataflowReshape" else p
              for p in backend.dataflow_lower_passes(target)]
    passes += backend.finalize_passes(target) + [ReuseShapeValues(), ShapeFunctionsNoAlias()]

    @tvm.transform.module_pass(opt_level=0, name="tfx.finalize")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


def finalize(mod: tvm.IRModule, target: tvm.target.Target):
    """``tvm.compile`` of a scheduled module: the executable (``relax.VirtualMachine(ex, dev)`` runs it)."""
    if TargetInfo.of(target).is_cuda:
        return tvm.compile(mod, target, relax_pipeline=finalize_pipeline(target))
    from .codegen.serial_when_small import SerialWhenSmall, serial_when_small_rules
    from .codegen.row_prefetch import InsertRowPrefetch
    from .codegen.weight_prefetch import TIR_PIPELINE, InsertWeightPrefetch

    mod = InsertRowPrefetch()(InsertWeightPrefetch()(mod))
    rules = serial_when_small_rules()
    if rules != ():
        mod = SerialWhenSmall(rules)(mod)
    return tvm.compile(mod, target, relax_pipeline=finalize_pipeline(target), tir_pipeline=TIR_PIPELINE)
