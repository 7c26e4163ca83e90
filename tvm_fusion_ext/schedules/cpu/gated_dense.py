"""CPU template for ``fused_gated_dense``: the dense micro-kernel with both halves of each column in one tile.

Loop nest (outer to inner)::

    par = fuse(ip, j0)        parallel over output tiles (rows split ip ways × N/nr column panels)
      i0                      row tiles of mr rows inside the task
        acc[mr, nr, 2] = 0    gate and up accumulators of nr columns, side by side: one vector row
        k0, k1                K loop outside the micro-kernel
          i1 (unrolled, mr)   one broadcast of x per row ...
            (j1, h) (vector)  ... times one contiguous nr×2 panel row of the interleaved weight
        write-back            act(gate + bg) · (up + bu), cast: from the tile, N wide; the 2N pair never
                              reaches memory

The weight is pre-packed at compile time into (N/nr, K, nr, 2) panels (``prepare_operator``), so each k step
reads one contiguous 2·nr vector. Rows known only at run time are padded by the operator to ``row_block`` (=mr),
as for ``fused_dense``; only the write-back of the last row tile is predicated.

Knobs (``sample_perfect_tile`` decisions unless said otherwise):
    ``i``: [ip, i0, mr] (static rows)   ``mr``: rows per tile (symbolic rows)   ``k``: [k0, kc]
    ``unroll``: index into :data:`UNROLL_STEPS` (``sample_categorical``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import tvm
from tvm import relax, s_tir

from ...ops.gated_dense import pack_gated_weight
from ...targets import TargetInfo
from ..common import flatten_rows_map, knob_decision, op_params, static_extents_reason
from ..rule import Knobs, TemplateRule
from .dense import (KC_MAX, MR_MAX, UNROLL_STEPS, default_ip, default_kc, default_mr, loop_extent, panel_group,
                    panel_row_vectors, prefetch_next_task, read_padded_rows_in_place, row_block_for,
                    row_independent_knobs, side_by_side_panels, wide_vectors)

#: columns per panel: 2·nr accumulators per row, so mr=4 rows of 8 columns keep 8 AVX2 (4 AVX-512) registers
#: of accumulators with room for the weight panel and the broadcast
GATED_NR = 8


def gated_pack_nr(n: int, target: Optional[tvm.target.Target] = None) -> int:
    """Panel width for a (K, n, 2) weight: a divisor of n when one fits, else a zero-padded last panel. A panel
    row is 2·nr floats: one AVX2 register pair at 8, two AVX-512 registers at 16 (see dense.py's tile)."""
    for nr in (16, GATED_NR, 4) if wide_vectors(target) else (GATED_NR, 16, 4):
        if n % nr == 0:
            return nr
    return GATED_NR


def gated_dense_cpu(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, target: tvm.target.Target,
                    knobs: Optional[dict] = None) -> None:
    """Tiles are laid out on the epilogue (rows × output columns) and the accumulator tile is computed at each:
    the epilogue reads both halves of a column (``acc[r, j, 0]``, ``acc[r, j, 1]``), an access
    ``reverse_compute_at`` cannot invert, while ``compute_at`` of the producer only needs its region."""
    knobs = knobs or {}
    params = op_params(sch)
    read_padded_rows_in_place(sch, block)
    _, j_acc, _, k = sch.get_loops(block)
    K = loop_extent(sch, k)
    epilogue = sch.get_consumers(block)[0]
    rows, cols = _flat_epilogue_loops(sch, epilogue, str(sch.get(j_acc).extent.ty))
    if params.get("w_layout") == "packed":
        nr = int(sch.get(block).reads[1].source.shape[2])
    else:  # a run-time weight, read in place: the widest panel dividing N
        N = loop_extent(sch, cols)
        nr = next(d for d in (GATED_NR, 16, 4, 2, 1) if N % d == 0)
    j0, j1 = sch.split(cols, [None, nr])
    n_tiles = loop_extent(sch, j0)
    row_block = params.get("row_block")
    itemsize = tvm.DataType(sch.get(block).reads[0].source.dtype).bits // 8
    side = 1
    if row_block is None:
        M = loop_extent(sch, rows)
        mr = default_mr(M, target)
        ip = default_ip(M // mr, n_tiles, TargetInfo.of(target).cores, mr * K * itemsize)
        i_dec = knob_decision(knobs.get("i"), [ip, M // (ip * mr), mr])
        ip_, i0, i1 = sch.split(rows, sch.sample_perfect_tile(
            rows, n=3, max_innermost_factor=max(MR_MAX, i_dec[-1]), decision=i_dec))
        sch.reorder(ip_, j0, i0, i1, j1)
        par, tile = sch.fuse(ip_, j0), i0
    else:
        # rows known only at run time: the accumulator is padded to row_block (= the tile), the epilogue's
        # last tile predicated; LoopPartition separates it so the full tiles' epilogue vectorises
        i0, i1 = sch.split(rows, [None, int(row_block)])
        group = panel_group(n_tiles, K * 2 * nr * itemsize, TargetInfo.of(target).cores)
        if group > 1:  # x streamed once per group of panels, not per panel (see dense.panel_group)
            par, tile = sch.split(j0, [None, group])
            side = side_by_side_panels(int(row_block), group, panel_row_vectors(2 * nr * itemsize, target))
            if side > 1:  # `side` panels of the group read in the same k step (see dense.side_by_side_panels)
                tile, beside = sch.split(tile, [None, side])
                sch.reorder(par, i0, tile, i1, beside, j1)
            else:
                sch.reorder(par, i0, tile, i1, j1)
        else:
            par, tile = j0, i0
            sch.reorder(j0, i0, i1, j1)
        sch.annotate(i0, "pragma_loop_partition_hint", 1)

    # the mr × nr × 2 accumulator tile, in registers, computed under the row tile that consumes it
    sch.set_scope(block, 0, "local")
    sch.compute_at(block, tile, preserve_unit_loops=True)
    a_rows, a_cols, a_half, a_k = sch.get_loops(block)[-4:]
    kc = default_kc(K)
    k_dec = knob_decision(knobs.get("k"), [K // kc, kc])
    k0, k1 = sch.split(a_k, sch.sample_perfect_tile(a_k, n=2, max_innermost_factor=max(KC_MAX, k_dec[-1]),
                                                    decision=k_dec))
    if side > 1:  # the panels side by side in each k step: one accumulator pair per panel
        a_side, a_cols = sch.split(a_cols, [side, nr])
        sch.reorder(k0, k1, a_rows, a_side, a_cols, a_half)
        sch.unroll(a_side)
    else:
        sch.reorder(k0, k1, a_rows, a_cols, a_half)
    # this thread's next task: the next group of panels (symbolic rows) or the next panel
    prefetch_next_task(sch, block, k1, group if row_block is not None else 1, row_block)
    sch.parallel(par)  # before decompose_reduction, which leaves a block the parallel check refuses
    lanes = sch.fuse(a_cols, a_half)  # gate and up of nr columns: one contiguous 2·nr panel row
    sch.unroll(a_rows)
    sch.vectorize(lanes)  # before decompose_reduction: the init block inherits the vector loop
    init = sch.decompose_reduction(block, k0)
    sch.unroll(sch.get_loops(init)[-2])

    sch.unroll(i1)
    sch.vectorize(j1)
    u = sch.sample_categorical(list(UNROLL_STEPS), [1.0 / len(UNROLL_STEPS)] * len(UNROLL_STEPS),
                               decision=knobs.get("unroll", 1))
    sch.annotate(par, "pragma_auto_unroll_max_step", u)
    sch.annotate(par, "pragma_unroll_explicit", 1)


def _flat_epilogue_loops(sch: s_tir.Schedule, epilogue, idx_dtype: str):
    """``(rows, cols)``: the epilogue's (batch, seq) axes made the one row axis the accumulator has, so its
    tiles are rectangles of the accumulator."""
    loops = sch.get_loops(epilogue)
    if len(loops) > 2:
        sch.transform_block_layout(epilogue, flatten_rows_map([sch.get(lp).extent for lp in loops[:-1]], 1,
                                                             idx_dtype))
    return sch.get_loops(epilogue)


@dataclass(frozen=True)
class GatedDenseCpuKnobs(Knobs):
    i: Optional[Sequence[int]] = None       # [ip, i0, mr] (static rows)
    mr: Optional[int] = None                # symbolic rows: rows per register tile (the operator's row_block)
    k: Optional[Sequence[int]] = None       # [k0, kc]
    unroll: Optional[int] = None            # index into UNROLL_STEPS


class GatedDenseCPU(TemplateRule):
    """``fused_gated_dense`` on CPU: register-blocked micro-kernel over interleaved gate/up panels."""

    block_rule = "tfx.gated_dense"
    family = "cpu"
    Knobs = GatedDenseCpuKnobs

    def decline(self, sch, block, target):
        _, j, _, k = sch.get_loops(block)
        return static_extents_reason(sch, (("columns", j), ("reduction", k)))

    def schedule(self, sch, block, target, knobs=None):
        gated_dense_cpu(sch, block, target, knobs)

    def transferable_knobs(self, static):
        """As the dense template: ``k``, ``unroll``, and ``i[-1]`` as ``mr`` (the panel width is the layout's)."""
        return row_independent_knobs(static, ("k", "unroll"))

    def prepare_operator(self, call, target):
        """Constant weights packed into (N/nr, K, nr, 2) panels; symbolic rows, or static rows with no divisor near
        the register tile, padded to it (:func:`~.dense.row_block_for`)."""
        if call.op != "fused_gated_dense":
            return None
        inputs, params = {}, dict(call.params)
        w = call.constant("w")
        if params.get("w_layout", "plain") == "plain" and w is not None:
            n = int(w.shape[1])
            inputs["w"] = relax.const(pack_gated_weight(w, gated_pack_nr(n, target)))
            params.update(w_layout="packed", out_features=n)
        if params.get("row_block") is None:
            row_block = row_block_for(call, self.knobs.mr, self.knobs.i, target)
            if row_block is not None:
                params.update(row_block=row_block, row_clamp="likely")  # see ops/dense.py::real_row
        return call.replace(inputs=inputs, params=params) if params != call.params else None
