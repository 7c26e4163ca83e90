"""Symbolic CPU attention takes 64- or 32-row query tiles on long requests, when the padding they add is worth it.

A ``fused_attention`` whose query rows are known only at run time pads them to 16-row tiles
(:data:`~tvm_fusion_ext.schedules.cpu.attention.SYMBOLIC_QUERY_TILE`): a short request wastes at most 15 rows. A
long one pays for the small tile instead: every task (one tile of one head) re-initialises its running state,
folds it once per key block and writes it out, for only 16 rows of work. Measured on the 2-core Zen 4 VM
(MiniLM's attention, 12 heads × 32, Q/K/V read in place from the QKV projection, one process, interleaved; time
against 16-row tiles): 64-row tiles 0.85–0.87 at (batch, seq) = (8, 128), 0.87–0.90 at (1, 128), 0.93–0.94 at
(1, 256), 0.94–0.95 at (1, 384); 32-row tiles 0.89–0.93 / 0.84–0.93 / 0.96 / 0.97. Where they pad more rows than
16-row tiles do, they lose: 1.38 (64) and 1.12 (32) at 80 rows, 1.15 / 1.09 at 100, 1.13 / 1.03 at 200.

So each such kernel chooses at run time, from its own sizes: the tile whose padded rows cost least, a padded row
costing :data:`ROW_COST` (per cent of a 16-row tile's row) — and only while every core still gets
:data:`MIN_TASKS_PER_CORE` tasks, so that a single request on a many-core machine keeps its parallelism. At 128
or 384 rows that is 64, at 96 rows 32, at 80, 100 or 200 rows 16 (the kernel as built). The variants are the
operator with another ``query_block`` (:mod:`.branches`): the same scores, sums and outputs per row, the
Relax graph, the tuner's tasks and the records unchanged.

A decode step (one query row per sequence: a generation loop's every step after the first) takes a 1-row tile
(:data:`DECODE_TILE`): the 16-row tile computed 15 padded rows of scores and outputs against every cached key,
16× the work, where each key should be read once and used for one row.

Applied before :mod:`.short_keys`, so the kernel these branches live in is the one requests longer than the
short-key blocks run. Static query rows have the tile made for their count; packed (varlen) attention and
CUDA are left alone.
"""

from __future__ import annotations

import logging
from typing import Optional

import tvm
from tvm import tirx

from ...ops.attention import head_axis, key_geometry
from ...ops.registry import inputs_of, op_of, params_of
from ...schedules.cpu.attention import SYMBOLIC_QUERY_TILE
from ...targets import TargetInfo
from .branches import ScheduleFn, cpu_dispatch_pass, plain_parameters, with_cases

logger = logging.getLogger(__name__)

#: cost of one padded query row per tile size, in per cent of a row in a :data:`SYMBOLIC_QUERY_TILE`-row tile
#: (from the measurements above; the branch needs them right only where two tiles pad to about as many rows)
ROW_COST = {SYMBOLIC_QUERY_TILE: 100, 32: 95, 64: 88}
#: a larger tile is taken only while the kernel keeps at least this many tasks (head × tile) per core
MIN_TASKS_PER_CORE = 4
#: the tile of a request with one query row per sequence (a decode step)
DECODE_TILE = 1


def DispatchQueryTiles(target: tvm.target.Target, schedule_fn: ScheduleFn) -> tvm.transform.Pass:  # noqa: N802
    """Module pass over a scheduled module: every CPU attention with symbolic query rows in 16-row tiles becomes
    a run-time choice between 64-, 32- and 16-row tiles (templates only, no fallback)."""
    cores = TargetInfo.of(target).cores
    return cpu_dispatch_pass("tfx.DispatchQueryTiles", target, _refusal,
                             lambda func, schedule_fn: dispatch(func, schedule_fn, cores), schedule_fn, logger)


def _refusal(func) -> Optional[str]:
    """Why ``func`` gets no dispatch ("" when it is not a candidate at all), or None when it does."""
    if not isinstance(func, tirx.PrimFunc) or op_of(func) != "fused_attention":
        return ""
    if "cu_seqlens" in inputs_of(func):
        return "packed attention: its tiles follow its sequences"
    S, _, _ = key_geometry(func)
    if isinstance(S, int):
        return ""
    tile = params_of(func).get("query_block")
    if tile is not None and int(tile) != SYMBOLIC_QUERY_TILE:
        return f"query tile {tile} was chosen for it"
    if not plain_parameters(func):
        return "scalar size parameters"
    return None


def _padded(rows: tirx.PrimExpr, tile: int) -> tirx.PrimExpr:
    return (rows + tirx.IntImm("int64", tile - 1)) // tirx.IntImm("int64", tile) * tirx.IntImm("int64", tile)


def _request_dims(func: tirx.PrimFunc):
    """(batch, query rows, query heads) of the kernel: the first two its own size expressions."""
    S, _, _ = key_geometry(func)
    params = params_of(func)
    q_shape = func.params[inputs_of(func).index("q")].ty.shape  # 0.27: a parameter's type is its buffer
    heads = params.get("heads") or q_shape[head_axis(params.get("q_layout", "BSHD"))]
    return q_shape[0], S, int(heads)


def _int64(expr: tirx.PrimExpr) -> tirx.PrimExpr:
    return expr if str(expr.ty) == "int64" else expr.astype("int64")


def conditions(func: tirx.PrimFunc, cores: int) -> dict:
    """``{tile: condition}``: the decode tile first, then the larger tiles, largest first: the run-time test that
    picks each."""
    batch, rows, heads = _request_dims(func)
    batch, rows = _int64(batch), _int64(rows)
    cost = {t: _padded(rows, t) * tirx.IntImm("int64", c) for t, c in ROW_COST.items()}
    tasks = {t: batch * tirx.IntImm("int64", heads) * (_padded(rows, t) // tirx.IntImm("int64", t))
             for t in ROW_COST}
    enough = {t: tasks[t] >= tirx.IntImm("int64", MIN_TASKS_PER_CORE * cores) for t in ROW_COST}
    out = {DECODE_TILE: rows == tirx.IntImm("int64", 1)}
    for tile in sorted(ROW_COST, reverse=True):
        if tile == SYMBOLIC_QUERY_TILE:
            continue
        # cheaper than the kernel's own tile, and than every larger tile the request could use
        larger = [tirx.any(cost[tile] <= cost[t], tirx.Not(enough[t])) for t in ROW_COST if t > tile]
        out[tile] = tirx.all(enough[tile], cost[tile] < cost[SYMBOLIC_QUERY_TILE], *larger)
    return out


def tile_for(func: tirx.PrimFunc, cores: int, batch: int, rows: int) -> int:
    """The query tile the dispatch gives a request of ``batch`` × ``rows`` queries (what the kernel's branches test;
    for reports and tests)."""
    from tvm import sym

    from ...tir_nodes import substitute

    batch_dim, rows_dim, _ = _request_dims(func)
    values = {batch_dim: tirx.IntImm("int64", batch), rows_dim: tirx.IntImm("int64", rows)}
    for tile, condition in conditions(func, cores).items():
        if int(sym.Analyzer().simplify(substitute(condition, values))):
            return tile
    return SYMBOLIC_QUERY_TILE


def dispatch(func: tirx.PrimFunc, schedule_fn: ScheduleFn, cores: int) -> Optional[tirx.PrimFunc]:
    """``func`` (scheduled) with its larger-tile variants in front of it, or None when a variant cannot be made."""
    picks = conditions(func, cores)
    if not picks:
        return None
    cases = [(condition, f"{tile}-row", dict(params_of(func), query_block=tile)) for tile, condition in picks.items()]
    return with_cases(func, cases, schedule_fn, "tfx.query_tiles", ",".join(str(t) for t in picks), logger)
