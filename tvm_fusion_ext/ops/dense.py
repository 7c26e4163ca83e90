"""fused_dense: ``act(x @ W + bias)`` in one kernel.

``x``: (..., K); ``w``: (K, N), or (N, K) with ``transpose_b`` (ONNX Gemm transB / torch Linear layout), or
pre-packed (``w_layout="packed"``): (ceil(N / nr), K, nr) with zero padding past N, so the micro-kernel of
the CPU template streams one contiguous K×nr panel per output tile. The build path packs constant weights at
compile time (:func:`pack_weight`), the way ONNX Runtime pre-packs its GEMM weights.

Accumulates in fp32 whatever the input dtype; the epilogue (bias, activation, cast) runs on the accumulator
so it never makes another trip through memory. Activations use :mod:`.fastmath` so the epilogue vectorises.

Rows known only at run time (``x`` of shape (batch, seq, K)): with ``row_block`` set, the accumulator runs
over the rows flattened and padded up to a multiple of ``row_block`` (the ``dense_rows`` stage: the CPU template
reads it in place, the CUDA template gathers it per tile), the padding rows reading the last real row (a few
wasted FMAs, no out-of-bounds read), and the epilogue writes only the real rows. A template can then tile rows by ``row_block`` with no tail predicate inside its micro-kernel, which would otherwise keep
its accumulator tile out of registers. On CPU a request of fewer rows than the tile runs a copy of the kernel
built with a thinner ``row_block`` (:mod:`..compile.variants.short_rows`), not 8 padded rows. ``row_clamp`` says how a
padding row is clamped to the last real one (:func:`real_row`).

uint16 ``x`` and ``w`` are bfloat16 bit patterns (the bf16 precision's operands where the CPU multiplies with
``vdpbf16ps``, compile/precision.py), widened to fp32 exactly. ``w_layout="dot_panels"`` (bit patterns only): the
(ceil(N / nr), ceil(K / 2), nr, 2) k-pair panels of :func:`.dense_int8.pack_dot_panels`, the operand layout of
``vdpbf16ps``; the accumulator reduces over k-pairs and the k inside a pair, over the zero-padded columns, and an
odd K's last product goes to the epilogue, as in :mod:`.dense_int8`.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import te, tirx

from . import fastmath
from .registry import register_op

ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh")
W_LAYOUTS = ("plain", "packed", "dot_panels")
#: the type of bfloat16 operands given as bit patterns
BF16_BITS = "uint16"


def widen(v, acc_dtype: str):
    """An operand in the accumulator's type: bfloat16 bit patterns shifted into fp32's high half, else a cast."""
    if str(v.dtype) == BF16_BITS:
        return tirx.reinterpret("float32", tirx.Cast("uint32", v) << tirx.const(16, "uint32"))
    return v.astype(acc_dtype)


def activation(v, act: str):
    c = lambda x: tirx.const(x, v.ty)  # noqa: E731
    if act == "none":
        return v
    if act == "relu":
        return tirx.max(v, c(0.0))
    if act == "gelu":
        return c(0.5) * v * (c(1.0) + fastmath.erf(v * c(1.0 / math.sqrt(2.0))))
    if act == "gelu_tanh":
        return c(0.5) * v * (c(1.0) + fastmath.tanh(c(math.sqrt(2.0 / math.pi)) * (v + c(0.044715) * v * v * v)))
    if act == "silu":
        return v * fastmath.sigmoid(v)
    if act == "sigmoid":
        return fastmath.sigmoid(v)
    if act == "tanh":
        return fastmath.tanh(v)
    raise ValueError(f"fused_dense: unknown activation '{act}' (known: {', '.join(ACTIVATIONS)})")


def pack_weight(w: np.ndarray, nr: int, transpose_b: bool = False) -> np.ndarray:
    """(K, N) or (N, K) weight -> (ceil(N / nr), K, nr) panels, zero-padded past N."""
    wk = np.ascontiguousarray(w.T if transpose_b else w)  # (K, N)
    K, N = wk.shape
    tiles = -(-N // nr)
    padded = np.zeros((K, tiles * nr), dtype=wk.dtype)
    padded[:, :N] = wk
    return np.ascontiguousarray(padded.reshape(K, tiles, nr).transpose(1, 0, 2))


@register_op("fused_dense", inputs=("x", "w", "bias"))
def fused_dense(x, w, bias=None, *, act="none", transpose_b=False, w_layout="plain", out_features=None,
                acc_dtype="float32", out_dtype=None, row_block=None, row_clamp="min"):
    if w_layout not in W_LAYOUTS:
        raise ValueError(f"fused_dense: unknown weight layout '{w_layout}' (known: {', '.join(W_LAYOUTS)})")
    out_dtype = out_dtype or ("float32" if str(x.dtype) == BF16_BITS else x.dtype)
    if w_layout == "dot_panels":
        return _bf16_dot_panels(x, w, bias, act=act, out_features=out_features, out_dtype=out_dtype,
                                row_block=row_block, row_clamp=row_clamp)
    *batch, K = x.shape
    if w_layout == "packed":
        nr = int(w.shape[2])
        # the size in the index type of the rows (int64 when they are symbolic): TIR refuses mixed index types
        N = tirx.IntImm(str(x.shape[0].ty), int(out_features) if out_features is not None else int(w.shape[0]) * nr)
    else:
        N = w.shape[0] if transpose_b else w.shape[1]
    k = te.reduce_axis((0, K), name="k")

    def weight(j):
        if w_layout == "packed":
            return w[j // nr, k, j % nr]
        return w[j, k] if transpose_b else w[k, j]

    if row_block is None:
        def matmul(*idx):
            *b, j = idx
            return te.sum(widen(x[(*b, k)], acc_dtype) * widen(weight(j), acc_dtype), axis=k)

        acc = te.compute((*batch, N), matmul, name="dense", attrs={"schedule_rule": "tfx.dense"})
        at = lambda *idx: acc(*idx)  # noqa: E731  (a full index gives a PrimExpr; a tuple gives a TensorSlice)
    else:
        rows = dims_product(batch)
        padded = (rows + (int(row_block) - 1)) // int(row_block) * int(row_block)
        # The padded rows as their own (inlinable) stage: a row tile of it is a rectangle, which a template can
        # stage in shared memory; read through x's (batch, seq) dims the same tile is a bounding box in (b, s).
        padded_x = te.compute((padded, K), lambda r, c: x[(*unflatten_index(real_row(r, rows, row_clamp), batch), c)],
                              name="dense_rows", attrs={"schedule_rule": "None"})
        acc = te.compute((padded, N), lambda r, j: te.sum(
            widen(padded_x[r, k], acc_dtype) * widen(weight(j), acc_dtype),
            axis=k), name="dense", attrs={"schedule_rule": "tfx.dense"})
        at = lambda *idx: acc(flatten_index(idx[:-1], batch), idx[-1])  # noqa: E731

    def epilogue(*idx):
        v = at(*idx)
        if bias is not None:
            v = v + bias[idx[-1]].astype(acc_dtype)
        return activation(v, act).astype(out_dtype)

    # "None": MetaSchedule's generic rules leave the epilogue to the dense template, which inlines it.
    return te.compute((*batch, N), epilogue, name="dense_epilogue", attrs={"schedule_rule": "None"})


def row_accumulator(x, batch, N, row_block, row_clamp, reduce):
    """The ``dense`` stage (rows padded to ``row_block`` when given) and a reader of it by output index;
    ``reduce(xk, j)`` is the reduction, ``xk(k)`` the row's activation at ``k`` (the dot-panel layouts here and in
    :mod:`.dense_int8`)."""
    K = x.shape[-1]
    if row_block is None:
        acc = te.compute((*batch, N), lambda *idx: reduce(lambda k: x[(*idx[:-1], k)], idx[-1]),
                         name="dense", attrs={"schedule_rule": "tfx.dense"})
        return acc, (lambda *idx: acc(*idx))
    rows = dims_product(batch)
    padded = (rows + (int(row_block) - 1)) // int(row_block) * int(row_block)
    exact = _is_zero(padded - rows)  # static rows the tile divides: no clamp to read
    padded_x = te.compute((padded, K), lambda r, c: x[(*unflatten_index(r if exact else real_row(r, rows, row_clamp),
                                                                        batch), c)],
                          name="dense_rows", attrs={"schedule_rule": "None"})
    acc = te.compute((padded, N), lambda r, j: reduce(lambda k: padded_x[r, k], j),
                     name="dense", attrs={"schedule_rule": "tfx.dense"})
    return acc, (lambda *idx: acc(flatten_index(idx[:-1], batch), idx[-1]))


def _is_zero(expr) -> bool:
    from tvm import sym, tirx

    expr = sym.Analyzer().simplify(expr)
    return isinstance(expr, tirx.IntImm) and int(expr) == 0


def _bf16_dot_panels(x, w, bias, *, act, out_features, out_dtype, row_block, row_clamp):
    if str(x.dtype) != BF16_BITS or str(w.dtype) != BF16_BITS:
        raise ValueError(f"fused_dense: dot_panels takes bfloat16 bit patterns ({BF16_BITS}), not {x.dtype} x "
                         f"and {w.dtype} w")
    *batch, K = x.shape
    K = int(K)
    tiles, groups, nr, g = (int(d) for d in w.shape)
    if groups != -(-K // g):
        raise ValueError(f"fused_dense: dot_panels weight {tuple(w.shape)} does not cover K = {K}")
    idx_dtype = str(x.shape[0].ty)
    N = tirx.IntImm(idx_dtype, int(out_features) if out_features is not None else tiles * nr)
    full = K // g  # k-pairs inside K; an odd K's last product goes to the epilogue
    kg = te.reduce_axis((0, full), name="kg")
    kk = te.reduce_axis((0, g), name="kk")
    _, at = row_accumulator(x, batch, tirx.IntImm(idx_dtype, tiles * nr), row_block, row_clamp,
                         lambda xk, j: te.sum(widen(xk(kg * g + kk), "float32")
                                              * widen(w[j // nr, kg, j % nr, kk], "float32"), axis=[kg, kk]))

    def epilogue(*idx):
        v = at(*idx)
        row, j = idx[:-1], idx[-1]
        for t in range(K % g):
            v = v + widen(x[(*row, full * g + t)], "float32") * widen(w[j // nr, full, j % nr, t], "float32")
        if bias is not None:
            v = v + bias[j].astype("float32")
        return activation(v, act).astype(out_dtype)

    return te.compute((*batch, N), epilogue, name="dense_epilogue", attrs={"schedule_rule": "None"})


ROW_CLAMPS = ("min", "likely")


def real_row(r, rows, row_clamp: str = "min"):
    """Padded row ``r`` read as the last real row when past ``rows``.

    ``row_clamp`` "likely" (CPU templates ask for it): a branch hint, which LoopPartition (the templates hint the
    row-tile loop) uses to split off the last tile and drop the clamp from the full ones, whose rows are then one
    base pointer at constant offsets. With ``min`` the clamp stayed in every tile, and an unrolled 8-row tile's
    clamped row pointers left LLVM too few registers: it reloaded six of them from the stack in every step of the
    K loop (symbolic dense 1.08-1.14x its static twin at 16 rows, 0.99-1.06 with the hint). "min" for templates
    that stage a row tile (CUDA: ThreadSync refuses the branch around the shared-memory stores)."""
    if row_clamp not in ROW_CLAMPS:
        raise ValueError(f"unknown row_clamp '{row_clamp}' (known: {', '.join(ROW_CLAMPS)})")
    if row_clamp == "likely":
        return tirx.if_then_else(tirx.likely(r < rows), r, rows - 1)
    return tirx.min(r, rows - 1)


def dims_product(dims):
    out = dims[0]
    for d in dims[1:]:
        out = out * d
    return out


def flatten_index(idx, dims):
    row = idx[0]
    for i, d in zip(idx[1:], dims[1:]):
        row = row * d + i
    return row


def unflatten_index(row, dims):
    out = []
    for d in reversed(dims[1:]):
        out.append(tirx.floormod(row, d))
        row = tirx.floordiv(row, d)
    return [row, *reversed(out)]
