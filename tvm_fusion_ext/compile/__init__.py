"""One home for compilation: fuse → lower → schedule → finalize (see :mod:`.pipeline`).

=================  ==========================================================================================
``pipeline``       :func:`compile_model` (the entry point), :func:`build`, :func:`prepare`, :func:`fuse`
``lower``          Relax → unscheduled TIR, the lowering the tuner and the build share
``schedule``       tuning records, then templates, then the fallback
``record_knobs``   template knobs read back from records, per kernel signature (for kernels no record matches)
``finalize``       the backend's finalisation passes and ``tvm.compile``
``weights``        large constants lifted out of ``main`` into parameters (for artifacts)
``artifact``       ``tvm-fusion compile``: a model → an artifact directory (:func:`compile_artifact`)
=================  ==========================================================================================
"""

from .artifact import compile_artifact, save_artifact
from .finalize import finalize
from .lower import PrepareOperatorsForTemplates, VectorisableMath, lower
from .pipeline import Compiled, build, compile_model, fuse, prepare
from .schedule import ApplyTemplates, apply_records, schedule

__all__ = ["ApplyTemplates", "Compiled", "PrepareOperatorsForTemplates", "VectorisableMath", "apply_records",
           "build", "compile_artifact", "compile_model", "finalize", "fuse", "lower", "prepare", "save_artifact",
           "schedule"]
