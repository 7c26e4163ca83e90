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
    passes = backend.dataflow_lower_passes(target) + backend.finalize_passes(target)

    @tvm.transform.module_pass(opt_level=0, name="tfx.finalize")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline


def finalize(mod: tvm.IRModule, target: tvm.target.Target):
    """``tvm.compile`` of a scheduled module: the executable (``relax.VirtualMachine(ex, dev)`` runs it)."""
    return tvm.compile(mod, target, relax_pipeline=finalize_pipeline(target))
