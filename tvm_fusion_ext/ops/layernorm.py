"""fused_layernorm: ``LayerNorm(x [+ bias] + residual)`` over the last axis, in one kernel.

Statistics are fp32 whatever the input dtype. The row sum ``x + bias + residual`` is formed once per element;
mean and variance come from the same row (two-pass over a row that stays in cache), which is numerically
safer than E[x²]-E[x]² for rows with a large mean.
"""

from __future__ import annotations

from tvm import te, tirx

from .registry import register_op


@register_op("fused_layernorm", inputs=("x", "residual", "bias", "gamma", "beta"))
def fused_layernorm(x, residual=None, bias=None, gamma=None, beta=None, *, eps=1e-5, acc_dtype="float32"):
    *rows, N = x.shape
    dt = acc_dtype

    def row_input(*i):
        v = x[i].astype(dt)
        if residual is not None:
            v = v + residual[i].astype(dt)
        if bias is not None:
            v = v + bias[i[-1]].astype(dt)
        return v

    h = te.compute(x.shape, row_input, name="ln_input", attrs={"schedule_rule": "tfx.layernorm"})
    r1 = te.reduce_axis((0, N), name="r1")
    r2 = te.reduce_axis((0, N), name="r2")
    inv_n = tirx.const(1.0 / int(N), dt)
    total = te.compute(tuple(rows), lambda *i: te.sum(h[(*i, r1)], axis=r1), name="ln_sum")
    sqdev = te.compute(tuple(rows), lambda *i: te.sum(
        (h[(*i, r2)] - total[i] * inv_n) * (h[(*i, r2)] - total[i] * inv_n), axis=r2), name="ln_sqdev")

    def normalise(*i):
        r = i[:-1]
        v = (h[i] - total[r] * inv_n) * tirx.rsqrt(sqdev[r] * inv_n + tirx.const(eps, dt))
        if gamma is not None:
            v = v * gamma[i[-1]].astype(dt)
        if beta is not None:
            v = v + beta[i[-1]].astype(dt)
        return v.astype(x.dtype)

    return te.compute(x.shape, normalise, name="ln_output")
