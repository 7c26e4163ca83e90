"""Tuning driver: MetaSchedule over our templates (or its own sketches), expert rules, crash-safe logs.

Nothing heavy is imported here: ``tvm_fusion_ext.tune.driver`` pulls in MetaSchedule on first use.
"""

from __future__ import annotations


def tune(mod, target=None, logs: str = "tuning_logs", workload: str = "model", options=None, fuse: bool = True):
    """See :func:`tvm_fusion_ext.tune.driver.tune`."""
    from .driver import tune as _tune

    return _tune(mod, target, logs=logs, workload=workload, options=options, fuse=fuse)


__all__ = ["tune"]
