"""fused_gated_dense: ``act(x @ Wg + bg) ⊙ (x @ Wu + bu)`` in one kernel (the first half of a SwiGLU/GeGLU MLP).

``x``: (..., K); ``w``: the gate and up weights side by side per output column, (K, N, 2) with ``w[:, j, 0]``
the gate's column j and ``w[:, j, 1]`` the up projection's; or pre-packed (``w_layout="packed"``):
(ceil(N / nr), K, nr, 2), zero-padded past N, so the CPU micro-kernel streams one contiguous K × nr × 2 panel
per tile. ``bias``: (N, 2) in the same order (zeros where a projection has none).

Why (N, 2) and not two (K, N) weights: the gate and up accumulators of one output column sit next to each
other in every tile, so the tile that computes them also applies the gated epilogue from registers and only
the N-wide product reaches memory, never the 2N-wide pair of projections.

The accumulator runs over the rows flattened (batch × sequence), optionally padded up to a multiple of
``row_block`` (rows known only at run time, as in :mod:`.dense`: padding rows read the last real row and are
never written back). Accumulation is fp32 whatever the input dtype; the epilogue rounds once to ``out_dtype``.
"""

from __future__ import annotations

import numpy as np
from tvm import te, tirx

from .dense import activation, dims_product, flatten_index, real_row, unflatten_index
from .registry import register_op

#: activations a gated MLP applies to its gate (SwiGLU: silu; GeGLU: gelu, erf or tanh form)
GATE_ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "relu", "sigmoid")
W_LAYOUTS = ("plain", "packed")


def interleave_weights(w_gate: np.ndarray, w_up: np.ndarray) -> np.ndarray:
    """Two (K, N) weights -> the operator's (K, N, 2) layout."""
    return np.ascontiguousarray(np.stack([w_gate, w_up], axis=-1))


def side_by_side(w: np.ndarray) -> np.ndarray:
    """(K, N, 2) weight (or (N, 2) bias) -> the gate's N columns, then the up projection's: (K, 2N) (or (2N,)).
    The layout int8 computes the pair in (one ``fused_dense_int8``, then :func:`gate_product`)."""
    return np.ascontiguousarray(np.concatenate([w[..., 0], w[..., 1]], axis=-1))


def gate_product(y, act: str, out_dtype: str = "float32"):
    """TE: ``act(y[..., :N]) * y[..., N:]`` for y (..., 2N), the gate's columns then the up projection's (the
    output of the int8 pair, :func:`side_by_side`). Elementwise, so the generic CPU schedule vectorises it; at
    decode's few rows the 2N-wide input is a few tens of KB, read from L2."""
    if act not in GATE_ACTIVATIONS:
        raise ValueError(f"gate_product: unknown gate activation '{act}' (known: {', '.join(GATE_ACTIVATIONS)})")
    *batch, two_n = y.shape
    index_type = str(two_n.ty) if hasattr(two_n, "ty") else "int64"
    N = tirx.IntImm(index_type, int(two_n) // 2)

    def product(*idx):
        row, j = idx[:-1], idx[-1]
        gate, up = y[(*row, j)], y[(*row, j + N)]
        return (activation(gate.astype("float32"), act) * up.astype("float32")).astype(out_dtype)

    return te.compute((*batch, N), product, name="gate_product")


def pack_gated_weight(w: np.ndarray, nr: int) -> np.ndarray:
    """(K, N, 2) weight -> (ceil(N / nr), K, nr, 2) panels, zero-padded past N."""
    K, N, _ = w.shape
    tiles = -(-N // nr)
    padded = np.zeros((K, tiles * nr, 2), dtype=w.dtype)
    padded[:, :N] = w
    return np.ascontiguousarray(padded.reshape(K, tiles, nr, 2).transpose(1, 0, 2, 3))


@register_op("fused_gated_dense", inputs=("x", "w", "bias"))
def fused_gated_dense(x, w, bias=None, *, act="silu", w_layout="plain", out_features=None, acc_dtype="float32",
                      out_dtype=None, row_block=None, row_clamp="min"):
    if act not in GATE_ACTIVATIONS:
        raise ValueError(f"fused_gated_dense: unknown gate activation '{act}' (known: {', '.join(GATE_ACTIVATIONS)})")
    if w_layout not in W_LAYOUTS:
        raise ValueError(f"fused_gated_dense: unknown weight layout '{w_layout}' (known: {', '.join(W_LAYOUTS)})")
    out_dtype = out_dtype or x.dtype
    *batch, K = x.shape
    if not batch:
        raise ValueError("fused_gated_dense: x is a vector; it needs at least one row axis")
    # sizes and constant indices in the rows' index type: TIR refuses an access mixing int64 (symbolic rows)
    # with int32
    index_type = str(x.shape[0].ty)
    pair, gate_at, up_at = (tirx.IntImm(index_type, v) for v in (2, 0, 1))
    if w_layout == "packed":
        # the accumulator spans every panel, padding columns included (their weights are zeros), so a tile
        # never reaches past it; the epilogue writes the real columns
        nr = int(w.shape[2])
        acc_width = tirx.IntImm(index_type, int(w.shape[0]) * nr)
        N = tirx.IntImm(index_type, int(out_features) if out_features is not None else int(w.shape[0]) * nr)
    else:
        N = acc_width = w.shape[1]
    if int(w.shape[-1]) != 2:
        raise ValueError(f"fused_gated_dense: weight {list(w.shape)} does not end in the (gate, up) pair")
    rows = dims_product(batch)
    padded = rows if row_block is None else (rows + (int(row_block) - 1)) // int(row_block) * int(row_block)
    k = te.reduce_axis((0, K), name="k")

    def weight(j, h):
        return w[j // nr, k, j % nr, h] if w_layout == "packed" else w[k, j, h]

    if row_block is None:
        def row(r, c):
            return x[(*unflatten_index(r, batch), c)]
    else:
        # the padded rows as their own stage, as in fused_dense (``dense_rows``: templates copy or inline it)
        padded_x = te.compute((padded, K), lambda r, c: x[(*unflatten_index(real_row(r, rows, row_clamp), batch), c)],
                              name="dense_rows", attrs={"schedule_rule": "None"})

        def row(r, c):
            return padded_x[r, c]

    acc = te.compute((padded, acc_width, pair), lambda r, j, h: te.sum(
        row(r, k).astype(acc_dtype) * weight(j, h).astype(acc_dtype), axis=k),
        name="gated_dense", attrs={"schedule_rule": "tfx.gated_dense"})

    def epilogue(*idx):
        r, j = flatten_index(idx[:-1], batch), idx[-1]
        gate, up = acc(r, j, gate_at), acc(r, j, up_at)
        if bias is not None:
            gate, up = gate + bias[j, gate_at].astype(acc_dtype), up + bias[j, up_at].astype(acc_dtype)
        return (activation(gate, act) * up).astype(out_dtype)

    # "None": MetaSchedule's generic rules leave the epilogue to the template, which computes it per tile.
    return te.compute((*batch, N), epilogue, name="gated_dense_epilogue", attrs={"schedule_rule": "None"})
