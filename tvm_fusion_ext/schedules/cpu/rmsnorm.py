"""CPU template for ``fused_rmsnorm``: the LayerNorm template's schedule (one parallel task per row, the row
formed once into a buffer, the sum of squares rfactored into vector-lane partials, vector stores).

The LayerNorm schedule is written for any number of row statistics between the row input and the output
block; RMSNorm has one (the sum of squares) where LayerNorm has two."""

from __future__ import annotations

from .layernorm import LayerNormCPU


class RMSNormCPU(LayerNormCPU):
    """``fused_rmsnorm`` on CPU."""

    block_rule = "tfx.rmsnorm"
