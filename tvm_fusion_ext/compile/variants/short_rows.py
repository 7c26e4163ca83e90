"""Symbolic CPU dense kernels dispatch a request of a few rows to kernels with thinner row tiles.

A ``fused_dense``, ``fused_gated_dense`` or ``fused_dense_int8`` whose rows (batch × sequence) are known only at
run time pads them to its register tile (``row_block``: 8 rows with AVX-512, 4 with AVX2) so that the micro-kernel
carries no tail predicate. A request of 1 row then multiplies 8: measured on MiniLM's dynamic export at (batch,
seq) = (1, 1), the artifact took 2.99 ms against 1.47 ms for the static build (whose 1-row tile streams the weights
once), and a decoder step with a KV cache has a single row per sequence at every token. The int8 kernel is bound by
its multiplies more than the float one (AVX2 widens each weight pair and multiplies it per row): LLaMA-1024's int8
decode step at batch 1 took 6.6 ms with the 4-row tile and 5.9 ms with these variants (2-core Zen 3, interleaved).

This pass gives each such kernel a run-time choice: ``if rows <= 1`` a kernel with 1-row tiles, ``elif rows <= 2``
one with 2-row tiles, ``elif rows <= 4`` one with 4-row tiles (each only when thinner than the kernel's own tile),
else the kernel as built. Padded rows are never written back, and every branch reduces over K in the same
order, so each computes the same values per row.

Static rows, CUDA (its row tile is a thread block's, :mod:`...schedules.cuda.dense`) and kernels whose tile is
already at most the variants' are left alone, as is any kernel whose variants no template schedules.
"""

from __future__ import annotations

import logging
from typing import List, Optional

import tvm
from tvm import tirx

from ...ops.registry import inputs_of, op_of, params_of
from .branches import ScheduleFn, cpu_dispatch_pass, plain_parameters, with_variants

logger = logging.getLogger(__name__)

#: row tiles of the short-request variants, thinnest first: a request of R rows takes the first tile ≥ R
SHORT_ROW_BLOCKS = (1, 2, 4)
#: the operators whose CPU templates tile padded symbolic rows by the operator's ``row_block``
ROW_TILED_OPS = ("fused_dense", "fused_gated_dense", "fused_dense_int8")


def DispatchShortRows(target: tvm.target.Target, schedule_fn: ScheduleFn) -> tvm.transform.Pass:  # noqa: N802
    """Module pass over a scheduled module: every CPU dense kernel with padded symbolic rows becomes a run-time
    choice between itself and variants with :data:`SHORT_ROW_BLOCKS` (templates only, no fallback)."""
    return cpu_dispatch_pass("tfx.DispatchShortRows", target, _refusal, dispatch, schedule_fn, logger)


def _row_dims(func: tirx.PrimFunc) -> list:
    """x's leading dims (symbolic ones are the kernel's own variables)."""
    return list(func.params[inputs_of(func).index("x")].ty.shape)[:-1]  # 0.27: a parameter's type is its buffer


def rows_of(func: tirx.PrimFunc) -> tirx.PrimExpr:
    """The kernel's row count: the product of x's leading dims."""
    rows = tirx.IntImm("int64", 1)
    for d in _row_dims(func):
        rows = rows * (d if str(d.ty) == "int64" else d.astype("int64"))
    return rows


def _refusal(func) -> Optional[str]:
    """Why ``func`` gets no dispatch ("" when it is not a candidate at all), or None when it does."""
    if not isinstance(func, tirx.PrimFunc) or op_of(func) not in ROW_TILED_OPS:
        return ""
    row_block = params_of(func).get("row_block")
    if row_block is None or "x" not in inputs_of(func):
        return ""
    if all(isinstance(d, tirx.IntImm) for d in _row_dims(func)):
        return ""  # static rows padded to a tile (a prime row count): known at build time, nothing to choose
    if not _thinner(func):
        return f"row tile {row_block} is already thin"
    if not plain_parameters(func):
        return "scalar size parameters"
    return None


def _thinner(func: tirx.PrimFunc) -> List[int]:
    """The variants' row tiles thinner than the kernel's (AVX2's 4-row tile gets 1 and 2)."""
    return [rows for rows in SHORT_ROW_BLOCKS if rows < int(params_of(func)["row_block"])]


def dispatch(func: tirx.PrimFunc, schedule_fn: ScheduleFn) -> Optional[tirx.PrimFunc]:
    """``func`` (scheduled) with its short-row variants in front of it, or None when a variant cannot be made."""
    variants = [(rows, f"{rows}-row", dict(params_of(func), row_block=rows)) for rows in _thinner(func)]
    return with_variants(func, rows_of(func), variants, schedule_fn, "tfx.short_row_blocks", logger)
