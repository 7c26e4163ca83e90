"""Symbolic CPU attention runs a decode step (one query row) with the split-K decode kernel.

A ``fused_attention`` whose query rows are known only at run time serves both the prompt (many rows) and every
generated token after it (one row per sequence, against the whole cache). The flash-loop kernel takes a 1-row
tile for the latter (:mod:`.query_tiles`), but still runs one task per (batch, query head) that scans all keys,
and with grouped K/V heads reads each K/V head once per query head. The decode form of the operator
(``split_blocks``: :mod:`...ops.decode_attention`) parallelises over (batch, K/V head, key split) and reads each
K/V row once for the whole group.

This pass puts it in front of the kernel as built: ``if rows == 1`` the decode kernel, else what the other
variants made. Applied last, so it is the outermost branch: a one-token step never reaches the short-key or
query-tile branches. Static query rows get the decode form from the template instead
(:meth:`~tvm_fusion_ext.schedules.cpu.attention.AttentionCPU.prepare_operator`); packed (varlen) attention and
CUDA are left alone. The branch reads and writes the kernel's own buffers (:mod:`.branches`), so the Relax graph,
the tuner's tasks and the records are unchanged.

Unlike the other dispatches, kernels that take a size as a scalar parameter are candidates: a decoder's keys are
``past + new`` (its cache and the new tokens), so its attention kernel takes ``past`` as one. The variant is the
operator rebuilt over the kernel's own dims, so it takes the same parameters (:func:`.branches.with_cases` checks
them one by one and drops the branch otherwise).
"""

from __future__ import annotations

import logging
from typing import Optional

import tvm
from tvm import tirx

from ...ops.attention import key_geometry
from ...ops.decode_attention import decode_params
from ...ops.registry import inputs_of, op_of, params_of
from .branches import ScheduleFn, cpu_dispatch_pass, with_cases

logger = logging.getLogger(__name__)

#: the attribute naming the kernels that have the decode branch (reports and tests read it)
DECODE_ATTR = "tfx.decode_branch"


def DispatchDecode(target: tvm.target.Target, schedule_fn: ScheduleFn) -> tvm.transform.Pass:  # noqa: N802
    """Module pass over a scheduled module: every CPU attention with symbolic query rows runs one-row requests
    with the decode kernel (templates only, no fallback)."""
    return cpu_dispatch_pass("tfx.DispatchDecode", target, _refusal, dispatch, schedule_fn, logger)


def _refusal(func) -> Optional[str]:
    """Why ``func`` gets no dispatch ("" when it is not a candidate at all), or None when it does."""
    if not isinstance(func, tirx.PrimFunc) or op_of(func) != "fused_attention":
        return ""
    if "cu_seqlens" in inputs_of(func):
        return "packed attention: its rows are many sequences' tokens"
    if params_of(func).get("split_blocks") is not None:
        return ""
    S, _, _ = key_geometry(func)
    if isinstance(S, int):
        return ""
    return None


def dispatch(func: tirx.PrimFunc, schedule_fn: ScheduleFn) -> Optional[tirx.PrimFunc]:
    """``func`` (scheduled) with the decode kernel in front of it for one-row requests, or None when the decode
    kernel cannot be made."""
    S, T, _ = key_geometry(func)
    rows = S if str(S.ty) == "int64" else S.astype("int64")
    cases = [(rows == tirx.IntImm("int64", 1), "decode", decode_params(params_of(func), T))]
    return with_cases(func, cases, schedule_fn, DECODE_ATTR, "1", logger)
