"""CUDA template for ``fused_rmsnorm``: the LayerNorm template's schedule (one thread block per row, the row
staged in shared memory, the sum of squares as one cross-thread reduction, vector loads and stores).

The LayerNorm schedule is written for any number of row statistics between the row input and the output
block; RMSNorm has one (the sum of squares) where LayerNorm has two."""

from __future__ import annotations

from .layernorm import LayerNormCUDA


class RMSNormCUDA(LayerNormCUDA):
    """``fused_rmsnorm`` on CUDA."""

    block_rule = "tfx.rmsnorm"
