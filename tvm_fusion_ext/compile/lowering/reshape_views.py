"""Reshape kernels as free views, where TVM's own analysis can say so."""

from __future__ import annotations

import tvm
from tvm import relax


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
