"""CUDA template for ``fused_gated_dense``: the SIMT GEMM of :mod:`.dense` with both halves of a column in one
thread.

::

    blockIdx.y, blockIdx.x      block tile BM × BN output columns (BN gate and BN up accumulators)
      threadIdx.y, threadIdx.x  one thread owns yi × xi × 2 accumulators in registers: the gate and up sums
                                of the same xi columns
        ko                      x (BM × kc) and the interleaved weight (kc × BN × 2) staged in shared memory
          ki, yi, xi, h         register-blocked FMAs
        write-back              act(gate + bg) · (up + bu), cast: the thread's yi × xi results, from registers

fp32 and fp16/bf16 inputs take this path (fp32 accumulation either way). Rows known only at run time (batch ×
sequence): the build pads the accumulator's rows to :data:`SYMBOLIC_ROW_BLOCK` (``prepare_operator``), one
thread block's rows, and the epilogue writes the real rows; x and W are then read straight from global memory
(through L1), as the staged tile of a gathered, clamped row index is not a rectangle TVM can bound.

Knobs: as the fp32 dense template (``i``, ``j``, ``k``, ``vec``, ``unroll``), ``j`` counting output columns; a
static record's knobs reach symbolic kernels as the dense's do (:func:`.dense.simt_transferable_knobs`).
"""

from __future__ import annotations

from typing import Optional

import tvm
from tvm import s_tir

from ...targets import TargetInfo
from ..common import (flatten_rows_map, knob_decision, op_params, pad_symbolic_rows, padded_rows_stage,
                      static_extents_reason)
from ..rule import TemplateRule
from .dense import (
    UNROLL_STEPS,
    VECTOR_WIDTHS,
    DenseCudaKnobs,
    simt_defaults,
    simt_transferable_knobs,
    stage_in_shared,
)

#: rows of the padded accumulator per thread block when rows are symbolic (the operator's ``row_block``)
SYMBOLIC_ROW_BLOCK = 32


def gated_dense_cuda(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, target: tvm.target.Target,
                     knobs: Optional[dict] = None) -> None:
    """Threads are laid out on the epilogue (rows × output columns) and each thread's accumulators are computed
    at its tile (``compute_at``: the epilogue reads both halves of a column, which ``reverse_compute_at``
    cannot invert)."""
    knobs = knobs or {}
    lim = TargetInfo.of(target).limits()
    padded_rows = padded_rows_stage(sch, block)
    if padded_rows is not None:  # symbolic rows: x is read in place (through L1), not staged
        sch.compute_inline(padded_rows)
    _, j_acc, _, k = sch.get_loops(block)
    K = int(sch.get(k).extent)
    epilogue = sch.get_consumers(block)[0]
    rows, cols = _flat_epilogue_loops(sch, epilogue, str(sch.get(j_acc).extent.ty))
    symbolic = not isinstance(sch.get(rows).extent, tvm.tirx.IntImm)
    M = int(op_params(sch).get("row_block") or SYMBOLIC_ROW_BLOCK) if symbolic else int(sch.get(rows).extent)
    N = int(sch.get(cols).extent)
    # the dense defaults, counted in output columns: a thread then holds 4 × 4 × 2 = 32 fp32 accumulators, well
    # inside the register file with its operand fragments (checked: no spills, tests/ops/test_gated_dense_op.py)
    d = simt_defaults(M, N, K, lim)
    if symbolic:  # one thread block per padded row tile; the last one's epilogue is predicated
        ti = [None, *knob_decision(knobs.get("i"), d["i"])[1:]]
        if M % (ti[1] * ti[2]):
            raise ValueError(f"row tile {ti[1]}x{ti[2]} does not divide the row block {M}")
    else:
        ti = sch.sample_perfect_tile(rows, n=3, max_innermost_factor=8, decision=knob_decision(knobs.get("i"), d["i"]))
    tj = sch.sample_perfect_tile(cols, n=3, max_innermost_factor=8, decision=knob_decision(knobs.get("j"), d["j"]))
    by, ty, yi = sch.split(rows, ti)
    bx, tx, xi = sch.split(cols, tj)
    sch.reorder(by, bx, ty, tx, yi, xi)
    sch.bind(by, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")

    sch.set_scope(block, 0, "local")  # the (rows, N, 2) pair lives in registers, never in global memory
    sch.compute_at(block, tx, preserve_unit_loops=True)
    a_rows, a_cols, a_half, a_k = sch.get_loops(block)[-4:]
    tk = sch.sample_perfect_tile(a_k, n=2, max_innermost_factor=64, decision=knob_decision(knobs.get("k"), d["k"]))
    ko, ki = sch.split(a_k, tk)
    sch.reorder(ko, ki, a_rows, a_cols, a_half)

    vec = sch.sample_categorical(list(VECTOR_WIDTHS), [1.0 / len(VECTOR_WIDTHS)] * len(VECTOR_WIDTHS),
                                 decision=knobs.get("vec", d["vec"]))
    for idx in (() if symbolic else (0, 1)):
        stage_in_shared(sch, block, idx, ko, ti[1], tj[1], vec)

    sch.decompose_reduction(block, ko)
    u = sch.sample_categorical(list(UNROLL_STEPS), [1.0 / len(UNROLL_STEPS)] * len(UNROLL_STEPS),
                               decision=knobs.get("unroll", d["unroll"]))
    sch.annotate(by, "pragma_auto_unroll_max_step", u)
    sch.annotate(by, "pragma_unroll_explicit", 1)


def _flat_epilogue_loops(sch: s_tir.Schedule, epilogue, idx_dtype: str):
    """``(rows, cols)``: the epilogue's (batch, seq) axes made the one row axis the accumulator has."""
    loops = sch.get_loops(epilogue)
    if len(loops) > 2:
        sch.transform_block_layout(epilogue, flatten_rows_map([sch.get(lp).extent for lp in loops[:-1]], 1,
                                                             idx_dtype))
    return sch.get_loops(epilogue)


class GatedDenseCUDA(TemplateRule):
    """``fused_gated_dense`` on CUDA (fp32, fp16, bf16): SIMT GEMM with the gated epilogue in registers."""

    block_rule = "tfx.gated_dense"
    family = "cuda"
    Knobs = DenseCudaKnobs

    def decline(self, sch, block, target):
        rows, cols, _, k = sch.get_loops(block)
        reason = static_extents_reason(sch, (("columns", cols), ("reduction", k)))
        if reason:
            return reason
        if not isinstance(sch.get(rows).extent, tvm.tirx.IntImm) and op_params(sch).get("row_block") is None:
            return "symbolic rows are not padded to a row block"
        return None

    def schedule(self, sch, block, target, knobs=None):
        gated_dense_cuda(sch, block, target, knobs)

    def transferable_knobs(self, static):
        """As the dense: the static and symbolic paths are both SIMT, whatever the dtype."""
        return simt_transferable_knobs(static)

    def prepare_operator(self, call, target):
        """Rows known only at run time padded to one thread block's rows (see the module docstring)."""
        return pad_symbolic_rows(call, "fused_gated_dense", self.knobs.row_block or SYMBOLIC_ROW_BLOCK)
