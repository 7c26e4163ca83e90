"""Lowering: Relax (fused or not) → Relax calling TIR PrimFuncs, none of them scheduled yet.

:func:`lower` is the only way a module reaches TIR in this package: the tuner extracts its tasks from
``lower(mod, target)`` and the build schedules ``lower(mod, target)``, so a tuning record always finds its
workload again. Its passes, in order (each in :mod:`.checks` or :mod:`.lowering` unless TVM's):

- safety: :class:`~.checks.gather_indices.CheckGatherIndices`, ``ClampGatherIndices``,
  :class:`~.checks.matmul_reductions.CheckMatmulReductions`, :class:`~.checks.reshape_sizes.CheckReshapeSizes`,
  then :func:`~.lowering.low_precision.AccumulateInFloat32` and library dispatch (sampling, sort/scan);
- operator calls re-derived for the target's templates
  (:func:`~.lowering.prepare_operators.PrepareOperatorsForTemplates`);
- the stock legalize/fuse passes, with equal splits legalised as one kernel (:mod:`.lowering.split_kernel`),
  scalar-only calls kept out of fused groups (:mod:`.lowering.scalar_calls`) and symbolic dims defined first
  (:mod:`.lowering.shape_definitions`);
- CPU math rewrites (:func:`~.lowering.vectorisable_math.VectorisableMath`), then reshape-to-view rewriting
  (:func:`~.lowering.reshape_views.ReshapesAsViews`) so that pure reshapes never become kernels (nor tuning tasks).
"""

from __future__ import annotations

from typing import List, Optional

import tvm
from tvm import relax

from ..targets import TargetSpec, resolved_target
from .lowering.prepare_operators import PrepareOperatorsForTemplates
from .lowering.reshape_views import ReshapesAsViews
from .lowering.shape_definitions import ShapeDefinitionsFirst
from .lowering.vectorisable_math import VectorisableMath

__all__ = ["PrepareOperatorsForTemplates", "ReshapesAsViews", "ShapeDefinitionsFirst", "VectorisableMath", "lower"]


def lower(mod: tvm.IRModule, target: TargetSpec = None, knobs: Optional[dict] = None,
          kernel_knobs=None, templates: Optional[List] = None) -> tvm.IRModule:
    """Relax (fused by SemanticFusion or not) -> Relax calling unscheduled TIR PrimFuncs, for ``target``.
    ``knobs`` / ``kernel_knobs``: the template knobs the build will schedule with, for the operator parameters
    they decide (see :func:`PrepareOperatorsForTemplates`); the tuner lowers with neither. ``templates``: the
    compilation's template rules when the caller built them already (:func:`~.pipeline.compile_model` does)."""
    from ..transform.safe_gather import ClampGatherIndices
    from ..transform.shape_computations import ResolveShapeComputations
    from .checks.gather_indices import CheckGatherIndices
    from .checks.matmul_reductions import CheckMatmulReductions
    from .checks.reshape_sizes import CheckReshapeSizes
    from .lowering.low_precision import AccumulateInFloat32
    from .lowering.scalar_calls import KeepScalarCallsUnfused
    from .lowering.split_kernel import LEGALIZE

    target = resolved_target(target)
    passes = [
        ResolveShapeComputations(),  # an unfused dynamic-axis export still needs its lengths tied to its inputs
        CheckGatherIndices(),  # a bad token id, or a mask shorter than the cache, is refused, not read past
        ClampGatherIndices(),  # and a take never reads past its table, whoever calls the VM
        CheckMatmulReductions(),  # nor a length the export named apart past the other operand
        CheckReshapeSizes(),  # nor a reshape valid only for some lengths view the wrong number of elements
        AccumulateInFloat32(),  # stock fp16 matmuls/convolutions sum in float32, as ours do
        relax.backend.DispatchSampling(),
        relax.backend.DispatchSortScan(),
        PrepareOperatorsForTemplates(target, knobs, kernel_knobs, templates=templates),
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
