"""The last step: a scheduled module → a TVM executable, with the backend's own dataflow-lowering and
finalisation passes only. Legalisation, fusion and scheduling have happened already (the stock CPU
``tvm.compile`` pipeline would do no fusion and no scheduling at all)."""

from __future__ import annotations

import tvm

from ..targets import TargetInfo


def finalize_pipeline(target: tvm.target.Target) -> tvm.transform.Pass:
    if TargetInfo.of(target).is_cuda:
        from tvm.relax.backend.cuda import pipeline as backend
    else:
        from tvm.relax.backend.cpu_generic import pipeline as backend
    from .lower import ReshapesAsViews
    from .shape_reuse import ReuseShapeValues

    # the backend runs RewriteDataflowReshape again: the same guard against TVM's assertion (see ReshapesAsViews)
    passes = [ReshapesAsViews() if p.info.name == "RewriteDataflowReshape" else p
              for p in backend.dataflow_lower_passes(target)]
    passes += backend.finalize_passes(target) + [ReuseShapeValues(), _ShapeFunctionsNoAlias()]

    @tvm.transform.module_pass(opt_level=0, name="tfx.finalize")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


def finalize(mod: tvm.IRModule, target: tvm.target.Target):
    """``tvm.compile`` of a scheduled module: the executable (``relax.VirtualMachine(ex, dev)`` runs it)."""
    if TargetInfo.of(target).is_cuda:
        return tvm.compile(mod, target, relax_pipeline=finalize_pipeline(target))
    from .serial_when_small import SerialWhenSmall
    from .weight_prefetch import TIR_PIPELINE, InsertWeightPrefetch

    return tvm.compile(SerialWhenSmall()(InsertWeightPrefetch()(mod)), target,
                       relax_pipeline=finalize_pipeline(target), tir_pipeline=TIR_PIPELINE)


def _ShapeFunctionsNoAlias() -> tvm.transform.Pass:  # noqa: N802
    """Mark the VM's generated shape functions ``tirx.noalias``.

    A model with symbolic dims gets a ``shape_func`` PrimFunc (VMShapeLower) without that attribute, and in
    TVM 0.27's LLVM codegen one function without it in the module costs every kernel its ``noalias``
    arguments: the compute function is then inlined into its packed wrapper and LLVM can no longer keep a
    workspace-allocated accumulator tile in registers (measured: the symbolic CPU dense kernel 2.3x slower,
    and back to the static kernel's speed with this pass). A shape function reads and writes one shape heap
    only, so nothing it touches can alias."""

    @tvm.transform.module_pass(opt_level=0, name="tfx.ShapeFunctionsNoAlias")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        out = None
        for gv, func in mod.functions_items():
            if (isinstance(func, tvm.tirx.PrimFunc) and gv.name_hint.startswith("shape_func")
                    and not (func.attrs is not None and "tirx.noalias" in func.attrs)):
                out = out if out is not None else mod.clone()
                out[gv] = func.with_attr("tirx.noalias", True)
        return out if out is not None else mod

    return _pass
