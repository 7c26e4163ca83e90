"""fused_dense_int8: ``act(dequant(xq @ Wq) + bias)`` in one kernel, the dynamic-quantisation form of
:mod:`.dense`.

``x``: (..., K) uint8, quantised per row (``x_scale``, ``x_zero``: (..., 1), float32 and int32; see
:func:`~tvm_fusion_ext.compile.precision.quantize_rows`); ``w``: (K, N) int8, symmetric per output channel
(``w_scale``: (N,)), or (N, K) with ``transpose_b`` (the layout of the CUDA tensor-core path: each output
channel's K bytes contiguous, as ``mma``'s column-major B operand and ``ldmatrix`` want), or pre-packed (``w_layout="packed"``, the (ceil(N / nr), K, nr) panels of
:func:`.dense.pack_weight`); ``w_sum``: (N,) int32, the column sums of ``w``. The accumulator is
``sum_k xq·wq`` in int32 (the u8 × s8 product of VNNI's ``vpdpbusd``); the epilogue subtracts the zero point's
share (``x_zero · w_sum[j]``), scales by ``x_scale · w_scale[j]``, adds the bias and applies the activation, on the
accumulator, as :mod:`.dense` does. |acc| <= 255 · 127 · K fits int32 up to K = 66,000.

Rows known only at run time: ``row_block`` pads them as in :mod:`.dense` (the ``dense_rows`` stage), so the CPU
dense template (``tfx.dense``) schedules this operator as it does ``fused_dense``.
"""

from __future__ import annotations

import numpy as np
from tvm import te

from .dense import W_LAYOUTS, activation, dims_product, flatten_index, real_row, unflatten_index
from .registry import register_op


def quantize_weight(w: np.ndarray):
    """(K, N) float weight → (int8 (K, N), scale (N,) float32, column sums (N,) int32): symmetric per output
    channel, scale = max|w[:, j]| / 127 (1 for an all-zero column), round half to even as ONNX QuantizeLinear."""
    w = np.asarray(w, dtype=np.float32)
    amax = np.abs(w).max(axis=0)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
    return q, scale, q.astype(np.int32).sum(axis=0).astype(np.int32)


@register_op("fused_dense_int8", inputs=("x", "x_scale", "x_zero", "w", "w_scale", "w_sum", "bias"))
def fused_dense_int8(x, x_scale, x_zero, w, w_scale, w_sum, bias=None, *, act="none", w_layout="plain",
                     out_features=None, out_dtype="float32", row_block=None, row_clamp="min", transpose_b=False):
    if w_layout not in W_LAYOUTS:
        raise ValueError(f"fused_dense_int8: unknown weight layout '{w_layout}' (known: {', '.join(W_LAYOUTS)})")
    *batch, K = x.shape
    if not batch:
        raise ValueError("fused_dense_int8: x is a vector; it needs a row axis (its per-row scale)")
    if transpose_b and w_layout != "plain":
        raise ValueError("fused_dense_int8: transpose_b takes a plain (N, K) weight, not a packed one")
    if w_layout == "packed":
        from tvm import tirx

        nr = int(w.shape[2])
        N = tirx.IntImm(str(x.shape[0].ty), int(out_features) if out_features is not None else int(w.shape[0]) * nr)
    else:
        N = w.shape[0] if transpose_b else w.shape[1]
    k = te.reduce_axis((0, K), name="k")

    def weight(j):
        if w_layout == "packed":
            return w[j // nr, k, j % nr]
        return w[j, k] if transpose_b else w[k, j]

    if row_block is None:
        acc = te.compute((*batch, N), lambda *idx: te.sum(
            x[(*idx[:-1], k)].astype("int32") * weight(idx[-1]).astype("int32"), axis=k),
            name="dense", attrs={"schedule_rule": "tfx.dense"})
        at = lambda *idx: acc(*idx)  # noqa: E731
    else:
        rows = dims_product(batch)
        padded = (rows + (int(row_block) - 1)) // int(row_block) * int(row_block)
        padded_x = te.compute((padded, K), lambda r, c: x[(*unflatten_index(real_row(r, rows, row_clamp), batch), c)],
                              name="dense_rows", attrs={"schedule_rule": "None"})
        acc = te.compute((padded, N), lambda r, j: te.sum(
            padded_x[r, k].astype("int32") * weight(j).astype("int32"), axis=k),
            name="dense", attrs={"schedule_rule": "tfx.dense"})
        at = lambda *idx: acc(flatten_index(idx[:-1], batch), idx[-1])  # noqa: E731

    def epilogue(*idx):
        row, j = (*idx[:-1], 0), idx[-1]
        v = (at(*idx) - x_zero[row] * w_sum[j]).astype("float32") * (x_scale[row] * w_scale[j])
        if bias is not None:
            v = v + bias[j].astype("float32")
        return activation(v, act).astype(out_dtype)

    return te.compute((*batch, N), epilogue, name="dense_epilogue", attrs={"schedule_rule": "None"})
