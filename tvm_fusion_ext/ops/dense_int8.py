"""fused_dense_int8: ``act(dequant(xq @ Wq) + bias)`` in one kernel, the dynamic-quantisation form of
:mod:`.dense`.

``x``: (..., K) uint8 (or int16 holding the same u8 values: the operand type of AVX2's ``vpmaddwd``), quantised
per row (``x_scale``, ``x_zero``: (..., 1), float32 and int32; see
:func:`~tvm_fusion_ext.compile.precision.quantize_rows`); ``w``: (K, N) int8, symmetric per output channel
(``w_scale``: (N,)), or (N, K) with ``transpose_b`` (the layout of the CUDA tensor-core path: each output
channel's K bytes contiguous, as ``mma``'s column-major B operand and ``ldmatrix`` want), or pre-packed (``w_layout="packed"``, the (ceil(N / nr), K, nr) panels of
:func:`.dense.pack_weight`); ``w_sum``: (N,) int32, the column sums of ``w``. The accumulator is
``sum_k xq·wq`` in int32 (the u8 × s8 product of VNNI's ``vpdpbusd``); the epilogue subtracts the zero point's
share (``x_zero · w_sum[j]``), scales by ``x_scale · w_scale[j]``, adds the bias and applies the activation, on the
accumulator, as :mod:`.dense` does. |acc| <= 255 · 127 · K fits int32 up to K = 66,000.

``w_layout="dot_panels"``: the (ceil(N / nr), ceil(K / g), nr, g) panels of :func:`pack_dot_panels`, each
column's ``g`` consecutive k side by side (zeros past K and N), the operand layout of the x86 dot-product
instructions (``g`` = 2 for AVX2's ``vpmaddwd``, 4 for VNNI's ``vpdpbusd``; schedules/cpu/dot_intrin.py). The
accumulator then reduces over k-groups (``kg``) and the k inside a group (``kk``), over the padded columns (the
padding columns are zeros, so the micro-kernel needs no predicate), and a K that is not a multiple of ``g`` leaves
its last ``K mod g`` products to the epilogue: the micro-kernel reads x only inside its rows.

Rows known only at run time: ``row_block`` pads them as in :mod:`.dense` (the ``dense_rows`` stage), so the CPU
dense template (``tfx.dense``) schedules this operator as it does ``fused_dense``.
"""

from __future__ import annotations

import numpy as np
from tvm import te

from .dense import W_LAYOUTS as DENSE_W_LAYOUTS
from .dense import activation, row_accumulator
from .registry import register_op


#: ``dot_panels``: k-grouped panels for the dot-product micro-kernels (ops/dense.py takes them for bf16 too)
W_LAYOUTS = DENSE_W_LAYOUTS


def pack_dot_panels(w: np.ndarray, nr: int, group: int) -> np.ndarray:
    """(K, N) int8 weight → (ceil(N / nr), ceil(K / group), nr, group) panels, zero-padded past K and N."""
    K, N = w.shape
    kg, tiles = -(-K // group), -(-N // nr)
    padded = np.zeros((kg * group, tiles * nr), dtype=w.dtype)
    padded[:K, :N] = w
    return np.ascontiguousarray(padded.reshape(kg, group, tiles, nr).transpose(2, 0, 3, 1))


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
    from tvm import tirx

    if w_layout == "dot_panels":
        return _dot_panels(x, x_scale, x_zero, w, w_scale, w_sum, bias, act=act, out_features=out_features,
                           out_dtype=out_dtype, row_block=row_block, row_clamp=row_clamp)
    if w_layout == "packed":
        nr = int(w.shape[2])
        N = tirx.IntImm(str(x.shape[0].ty), int(out_features) if out_features is not None else int(w.shape[0]) * nr)
    else:
        N = w.shape[0] if transpose_b else w.shape[1]
    k = te.reduce_axis((0, K), name="k")

    def weight(j):
        if w_layout == "packed":
            return w[j // nr, k, j % nr]
        return w[j, k] if transpose_b else w[k, j]

    acc, at = row_accumulator(x, batch, N, row_block, row_clamp, lambda xk, j: te.sum(
        xk(k).astype("int32") * weight(j).astype("int32"), axis=k))
    return _epilogue(batch, N, at, x_scale, x_zero, w_scale, w_sum, bias, act, out_dtype)


def _dot_panels(x, x_scale, x_zero, w, w_scale, w_sum, bias, *, act, out_features, out_dtype, row_block,
                row_clamp):
    from tvm import tirx

    *batch, K = x.shape
    K = int(K)
    tiles, groups, nr, g = (int(d) for d in w.shape)
    if groups != -(-K // g):
        raise ValueError(f"fused_dense_int8: dot_panels weight {tuple(w.shape)} does not cover K = {K}")
    idx_dtype = str(x.shape[0].ty)
    N = tirx.IntImm(idx_dtype, int(out_features) if out_features is not None else tiles * nr)
    full = K // g  # k-groups inside K; the K mod g products past them go to the epilogue
    kg = te.reduce_axis((0, full), name="kg")
    kk = te.reduce_axis((0, g), name="kk")
    acc, at = row_accumulator(x, batch, tirx.IntImm(idx_dtype, tiles * nr), row_block, row_clamp,
                           lambda xk, j: te.sum(xk(kg * g + kk).astype("int32")
                                                * w[j // nr, kg, j % nr, kk].astype("int32"), axis=[kg, kk]))
    tail = [K - K % g + t for t in range(K % g)]

    def with_tail(*idx):
        v = at(*idx)
        row, j = idx[:-1], idx[-1]
        for t, kt in enumerate(tail):
            v = v + x[(*row, kt)].astype("int32") * w[j // nr, full, j % nr, t].astype("int32")
        return v

    return _epilogue(batch, N, with_tail, x_scale, x_zero, w_scale, w_sum, bias, act, out_dtype)


def _epilogue(batch, N, at, x_scale, x_zero, w_scale, w_sum, bias, act, out_dtype):
    def epilogue(*idx):
        row, j = (*idx[:-1], 0), idx[-1]
        v = (at(*idx) - x_zero[row] * w_sum[j]).astype("float32") * (x_scale[row] * w_scale[j])
        if bias is not None:
            v = v + bias[j].astype("float32")
        return activation(v, act).astype(out_dtype)

    return te.compute((*batch, N), epilogue, name="dense_epilogue", attrs={"schedule_rule": "None"})
