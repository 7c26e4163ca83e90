"""Symbolic CPU attention dispatches short requests to kernels with smaller key blocks.

A ``fused_attention`` whose key count is known only at run time is built with 128-key blocks
(:data:`~tvm_fusion_ext.ops.attention.SYMBOLIC_KEY_BLOCK`): fewer online-softmax folds on long requests, and the
signature of records tuned at 128 tokens. A request of 48 tokens then computes scores for 128 keys, 80 of them
padding: measured on MiniLM's six layers at (1, 48), 0.79 ms against 0.47 ms for the static kernel (64-key
blocks), a third of the artifact's gap to the static build there (with the branches: 0.42 ms, the static kernel
0.53 ms, in another session's runs).

This pass gives each such kernel a run-time choice: ``if T <= 8`` a kernel with 8-key blocks and 1-row query
tiles, ``elif T <= 32`` one with 32-key blocks, ``elif T <= 64`` one with 64-key blocks, else the kernel as
built. The 8-key variant also stops padding queries to 16 rows: a request of one token per sequence (a batch
of single-token requests) otherwise computed a 16 × 32 tile per head for one score (LLaMA-shaped decoder, 4
layers, at (batch, seq) = (4, 1): 0.80 ms of attention, 0.15 ms with the variant; the static kernel 0.07 ms).
Each variant is the operator with other ``key_block`` / ``query_block`` parameters, scheduled by the same rules
(its own signature takes the knobs of records tuned at that many keys, else the template's defaults), and
bounded like the others when causal. They read the same buffers, so the variants become branches of one
PrimFunc (:mod:`.branches`): the Relax graph, the tuner's tasks and the records are unchanged. Padded
keys weigh exactly 0 in every variant, so the branch changes no result beyond rounding order.

CUDA's symbolic attention already uses 32-key blocks; packed (varlen) attention bounds its own loop by the
sequences a tile spans (:mod:`.causal_skip`). Neither is touched, nor is any kernel whose structure the pass
does not recognise (the branch is an optimisation).
"""

from __future__ import annotations

import logging
from typing import Optional

import tvm
from tvm import tirx

from ...ops.attention import SYMBOLIC_KEY_BLOCK, key_geometry
from ...ops.registry import inputs_of, op_of, params_of
from .branches import ScheduleFn, cpu_dispatch_pass, plain_parameters, with_variants

logger = logging.getLogger(__name__)

#: key blocks of the short-request variants, smallest first: a request of T keys takes the first block ≥ T
SHORT_KEY_BLOCKS = (8, 32, 64)
#: query tiles of variants (by key block) for kernels whose query rows are symbolic too: up to 8 tokens, a tile
#: of one query row wastes nothing, where the kernel's 16-row tile computes 15 padded rows for a single token
SHORT_QUERY_BLOCKS = {8: 1}


def DispatchShortKeys(target: tvm.target.Target, schedule_fn: ScheduleFn) -> tvm.transform.Pass:  # noqa: N802
    """Module pass over a scheduled module: every symbolic-key CPU ``fused_attention`` becomes a run-time
    choice between itself and variants with :data:`SHORT_KEY_BLOCKS`, scheduled by ``schedule_fn`` (templates
    only, no fallback: a variant no template schedules is not worth a branch)."""
    return cpu_dispatch_pass("tfx.DispatchShortKeys", target, _refusal, dispatch, schedule_fn, logger)


def _refusal(func) -> Optional[str]:
    """Why ``func`` gets no dispatch ("" when it is not a candidate at all), or None when it does."""
    if not isinstance(func, tirx.PrimFunc) or op_of(func) != "fused_attention":
        return ""
    if "cu_seqlens" in inputs_of(func):
        return "packed attention: its loop is bounded by its sequences"
    S, T, kb = key_geometry(func)
    if isinstance(T, int):
        return ""
    if kb <= max(SHORT_KEY_BLOCKS):
        return f"key block {kb} is already short"
    if not plain_parameters(func):
        return "scalar size parameters"  # the variants' parameters are matched to the kernel's one by one
    return None


def _variant_params(func: tirx.PrimFunc, kb: int) -> dict:
    params = dict(params_of(func), key_block=kb)
    S, _, _ = key_geometry(func)
    qb = SHORT_QUERY_BLOCKS.get(kb)
    if qb is not None and not isinstance(S, int) and int(params.get("query_block") or 0) > qb:
        params["query_block"] = qb  # symbolic queries only: a static query count keeps the tile made for it
    return params


def dispatch(func: tirx.PrimFunc, schedule_fn: ScheduleFn) -> Optional[tirx.PrimFunc]:
    """``func`` (scheduled) with its short-key variants in front of it, or None when a variant cannot be made."""
    _, T, _ = key_geometry(func)
    variants = [(kb, f"{kb}-key", _variant_params(func, kb)) for kb in SHORT_KEY_BLOCKS]
    return with_variants(func, T, variants, schedule_fn, "tfx.short_key_blocks", logger)
