"""fused_quantize_rows: int8's per-row (token) activation quantisation in one kernel, in front of
``fused_dense_int8``.

``x``: (..., K) float32 → three outputs: ``q`` (..., K) in ``dtype`` (uint8, or int16 holding the same u8 values:
the operand type of AVX2's ``vpmaddwd``), ``scale`` (..., 1) float32 and ``zero`` (..., 1) int32. The arithmetic
is ONNX ``DynamicQuantizeLinear``'s per row, exactly as the stock Relax ops wrote it before this operator
(:func:`~tvm_fusion_ext.compile.precision.quantize_rows_stock`): the range always holds 0, ``scale = (hi - lo) /
255`` (1 for an all-zero row), ``zero = clip(round(-lo / scale), 0, 255)``, ``q = clip(round(x / scale) + zero, 0,
255)``, ``round`` half to even (TIR ``round``, what Relax ``round`` lowers to) and divisions, not reciprocal
multiplies, so every value is bit for bit the stock one.

``smooth`` (K,), optional: activation smoothing's per-channel ``1 / s`` (:mod:`..compile.calibration`), applied
to ``x`` as it is read (the same float32 multiply the graph did as a kernel of its own).

Six stock kernels read and wrote the activation about five times; here the row's minimum and maximum are two
reductions over a row that stays in L1, and one pass writes ``q`` (CPU template: schedules/cpu/quantize_rows.py,
one parallel task per row, vectorised).
"""

from __future__ import annotations

from tvm import te, tirx

from .registry import register_op

#: the activation types the dense kernels read
Q_DTYPES = ("uint8", "int16")


@register_op("fused_quantize_rows", inputs=("x", "smooth"))
def fused_quantize_rows(x, smooth=None, *, dtype="uint8"):
    if dtype not in Q_DTYPES:
        raise ValueError(f"fused_quantize_rows: unknown dtype '{dtype}' (known: {', '.join(Q_DTYPES)})")
    *batch, K = x.shape
    if not batch:
        raise ValueError("fused_quantize_rows: x is a vector; it needs a row axis (its per-row scale)")
    if str(x.dtype) != "float32":
        raise ValueError(f"fused_quantize_rows: x is {x.dtype}; it quantises float32")
    f32 = lambda v: tirx.const(v, "float32")  # noqa: E731

    # the row as read (smoothed when asked): formed once, the stage every later one reads (the CPU template keeps
    # it as a one-row buffer in L1)
    row = te.compute(x.shape, lambda *idx: x[idx] * smooth[idx[-1]] if smooth is not None else x[idx],
                     name="qr_input", attrs={"schedule_rule": "tfx.quantize_rows"})
    k_lo = te.reduce_axis((0, K), name="k_lo")
    k_hi = te.reduce_axis((0, K), name="k_hi")
    row_min = te.compute((*batch, 1), lambda *i: te.min(row[(*i[:-1], k_lo)], axis=k_lo), name="qr_min")
    row_max = te.compute((*batch, 1), lambda *i: te.max(row[(*i[:-1], k_hi)], axis=k_hi), name="qr_max")

    def lo(i):
        return tirx.min(row_min[i], f32(0.0))

    def scale_of(*i):
        span = (tirx.max(row_max[i], f32(0.0)) - lo(i)) / f32(255.0)
        return tirx.Select(span == f32(0.0), f32(1.0), span)

    scale = te.compute((*batch, 1), scale_of, name="qr_scale")
    # clip as Relax's legalisation writes it: min with the top, then max with the bottom
    clip = lambda v: tirx.max(tirx.min(v, f32(255.0)), f32(0.0))  # noqa: E731
    zero = te.compute((*batch, 1), lambda *i: clip(tirx.round(-lo(i) / scale[i])).astype("int32"), name="qr_zero")

    def quantised(*idx):
        # the zero point is a whole number in [0, 255]: back in float32 it is the value it was computed as
        r = (*idx[:-1], 0)
        return clip(tirx.round(row[idx] / scale[r]) + zero[r].astype("float32")).astype(dtype)

    q = te.compute(x.shape, quantised, name="qr_q")
    return [q, scale, zero]
