"""Symbolic attention runs a decode step (one query row) with the split-K decode kernel, on CPU and CUDA.

A ``fused_attention`` whose query rows are known only at run time serves both the prompt (many rows) and every
generated token after it (one row per sequence, against the whole cache). The flash-loop kernel takes a 1-row
tile for the latter (:mod:`.query_tiles`), but still runs one task per (batch, query head) that scans all keys,
and with grouped K/V heads reads each K/V head once per query head. The decode form of the operator
(``split_blocks``: :mod:`...ops.decode_attention`) parallelises over (batch, K/V head, key split) and reads each
K/V row once for the whole group.

This pass puts it in front of the kernel as built: ``if rows == 1`` the decode kernel, else what the other
variants made. Applied last, so it is the outermost branch: a one-token step never reaches the short-key or
query-tile branches. Static query rows get the decode form from the template instead
(``prepare_operator`` of :class:`~tvm_fusion_ext.schedules.cpu.attention.AttentionCPU` and
:class:`~tvm_fusion_ext.schedules.cuda.attention.AttentionCUDA`); packed (varlen) attention is left alone. The
branch reads and writes the kernel's own buffers (:mod:`.branches`), so the Relax graph, the tuner's tasks and
the records are unchanged.

On CUDA the branch is one PrimFunc too: both bodies are kernel launches (their thread-bound loops become kernels
of their own when host and device code are split), and the ``if rows == 1`` stays in the host function, which
launches either the decode kernels (splits, then the combine) or the flash-loop ones. TVM's GPU lowering takes
that once the condition is marked thread-invariant and a root block sits above the branch
(:func:`.branches.with_cases`, ``launches``). The decode form there has
the CUDA template's tiles (:func:`~tvm_fusion_ext.schedules.cuda.decode_attention.cuda_decode_params`).

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
from ...schedules.cuda.decode_attention import cuda_decode_params
from ...targets import TargetInfo
from .branches import ScheduleFn, dispatch_pass, with_cases

logger = logging.getLogger(__name__)

#: the attribute naming the kernels that have the decode branch (reports and tests read it)
DECODE_ATTR = "tfx.decode_branch"


def DispatchDecode(target: tvm.target.Target, schedule_fn: ScheduleFn) -> tvm.transform.Pass:  # noqa: N802
    """Module pass over a scheduled module: every CPU or CUDA attention with symbolic query rows runs one-row
    requests with the decode kernel (templates only, no fallback)."""
    family = TargetInfo.of(target).family

    def _dispatch(func, schedule):
        return dispatch(func, schedule, family)

    return dispatch_pass("tfx.DispatchDecode", target, _refusal, _dispatch, schedule_fn, logger,
                         families=("cpu", "cuda"))


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


def dispatch(func: tirx.PrimFunc, schedule_fn: ScheduleFn, family: str = "cpu") -> Optional[tirx.PrimFunc]:
    """``func`` (scheduled for the ``family`` of targets) with the decode kernel in front of it for one-row
    requests, or None when the decode kernel cannot be made."""
    S, T, _ = key_geometry(func)
    rows = S if str(S.ty) == "int64" else S.astype("int64")
    params = (cuda_decode_params if family == "cuda" else decode_params)(params_of(func), T)
    cases = [(rows == tirx.IntImm("int64", 1), "decode", params)]
    return with_cases(func, cases, schedule_fn, DECODE_ATTR, "1", logger, launches=family == "cuda")
