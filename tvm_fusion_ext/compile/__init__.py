"""One home for compilation: fuse → precision → lower → schedule → finalize (see :mod:`.pipeline`).

The stages sit at the top of the package; the passes each stage runs are grouped below it by what they do.

=============================  =========================================================================================
``pipeline``                   :func:`compile_model` (the entry point), :func:`build`, :func:`prepare`, :func:`fuse`
``precision``                  ``apply_precision``: the constant-weight dense kernels in bf16 or int8 (after fusion)
``accuracy``                   the accuracy contract: a bf16/int8 build's outputs against the fp32 build's
``lower``                      Relax → unscheduled TIR, the lowering the tuner and the build share
``schedule``                   tuning records, then templates, then the fallback, then the run-time variants
``record_knobs``               template knobs read back from records, per kernel signature (for kernels no record
                               matches)
``finalize``                   the backend's finalisation passes and ``tvm.compile``
``artifact``                   ``tvm-fusion compile``: a model → an artifact directory (:func:`compile_artifact`)
**checks/**                    run-time refusals inserted by ``lower`` (a bad input is an error, never a wrong read)
``checks.gather_indices``      ``CheckGatherIndices``: token ids and mask lengths checked before a gather
``checks.matmul_reductions``   ``CheckMatmulReductions``: reduction lengths the export named apart checked equal
``checks.reshape_sizes``       ``CheckReshapeSizes``: symbolic reshapes checked to keep their element count
**lowering/**                  the other passes ``lower`` runs around TVM's legalize/fuse
``lowering.low_precision``     ``AccumulateInFloat32``: stock fp16 matmuls/convolutions sum in float32
``lowering.prepare_operators`` ``PrepareOperatorsForTemplates``: operator calls re-derived for the templates
``lowering.split_kernel``      ``LEGALIZE``: an equal split legalised as one kernel
``lowering.scalar_calls``      ``KeepScalarCallsUnfused``: scalar-only kernels kept out of fused groups
``lowering.shape_definitions`` ``ShapeDefinitionsFirst``: symbolic dims defined before the groups that use them
``lowering.vectorisable_math`` ``VectorisableMath``: CPU erf/exp/sigmoid/tanh as vectorisable arithmetic
``lowering.reshape_views``     ``ReshapesAsViews``: reshape kernels as free views (also in ``finalize``)
``lowering.mutation``          ``mutate_functions``: the one walk of the Relax-rewriting passes
``lowering.operator_calls``    a fused-operator call's operator, inputs and bound constants (for the passes above)
**variants/**                  run-time kernel variants ``schedule`` adds after the templates (CPU)
``variants.branches``          a kernel and its variants as branches of one PrimFunc, on its own symbolic sizes
``variants.causal_skip``       ``SkipMaskedKeyBlocks``: causal key-block loops bounded by their query tile
``variants.decode``            ``DispatchDecode``: one-row (decode) requests' split-K attention kernel
``variants.query_tiles``       ``DispatchQueryTiles``: long requests' attention query tiles
``variants.short_keys``        ``DispatchShortKeys``: short requests' attention key blocks
``variants.short_rows``        ``DispatchShortRows``: short requests' dense row tiles
**codegen/**                   what ``finalize`` and artifacts add around TVM's code generation
``codegen.weight_prefetch``    ``InsertWeightPrefetch``, ``TIR_PIPELINE``: CPU weight prefetch, stacked accumulators
``codegen.row_prefetch``       ``InsertRowPrefetch``: CPU prefetch of the rows a loop reads next (decode K/V rows)
``codegen.shape_reuse``        ``ReuseShapeValues``: each shape value computed once
``codegen.shape_functions``    ``ShapeFunctionsNoAlias``: shape functions ``noalias``, so kernels keep theirs
``codegen.weights``            ``lift_weights``: large constants lifted out of ``main`` into parameters (artifacts)
=============================  =========================================================================================
"""

from .artifact import compile_artifact, save_artifact
from .finalize import finalize
from .lower import PrepareOperatorsForTemplates, VectorisableMath, lower
from .pipeline import Compiled, build, compile_model, fuse, prepare
from .schedule import ApplyTemplates, apply_records, schedule

__all__ = ["ApplyTemplates", "Compiled", "PrepareOperatorsForTemplates", "VectorisableMath", "apply_records",
           "build", "compile_artifact", "compile_model", "finalize", "fuse", "lower", "prepare", "save_artifact",
           "schedule"]
