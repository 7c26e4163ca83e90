"""One-call conveniences over the passes."""

from __future__ import annotations

import tvm

from .transform.pipeline import SemanticFusion
from .transform.report import FusionReport


def fuse(mod: tvm.IRModule):
    """Run :func:`SemanticFusion` and return ``(fused_module, FusionReport)``."""
    with FusionReport.collect() as report:
        fused = SemanticFusion()(mod)
    return fused, report
