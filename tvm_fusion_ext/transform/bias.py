"""What a per-column bias is, for the rules that absorb one into a fused operator (dense, LayerNorm, QKV).

A fused operator adds its bias once per output column, so only a bias holding one value per column may be
absorbed: shape ``[N]``, or ``[1, …, 1, N]`` with no more axes than the output (more would broadcast the
output to a larger shape, which the fused operator cannot reproduce).
"""

from __future__ import annotations

from typing import List, Optional

from tvm import relax

from .graph import static_shape


def per_column_bias_error(shape: Optional[List[int]], width: int, out_rank: int) -> Optional[str]:
    """Why a bias of ``shape`` is not one value per output column (``[N]`` or ``[1, …, 1, N]``), else None."""
    if not shape or len(shape) > out_rank or shape[-1] != width or any(d != 1 for d in shape[:-1]):
        return f"bias of shape {shape} is not a per-column bias for output width {width}"
    return None


def as_vector(bb: relax.BlockBuilder, bias: relax.Expr) -> relax.Expr:
    """A ``[1, …, 1, N]`` bias as ``[N]`` (a free view); a vector is returned as is."""
    shape = static_shape(bias)
    return bias if len(shape) == 1 else bb.emit(relax.op.reshape(bias, [shape[-1]]))
