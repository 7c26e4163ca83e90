"""fused_rmsnorm: ``(x [+ residual]) · rsqrt(mean((x [+ residual])², last axis) + eps) · γ`` in one kernel.

RMSNorm (LLaMA, Qwen, Mistral, T5's LayerNorm): no mean subtraction, no β. Statistics are fp32 whatever the
input dtype, as the models compute them (they cast to fp32 around the norm); the result is rounded once, to
``out_dtype`` (default: the input's). The row sum ``x + residual`` is formed once per element, into the row
buffer the reduction and the output both read (it stays in cache).
"""

from __future__ import annotations

from tvm import te, tirx

from .registry import register_op


@register_op("fused_rmsnorm", inputs=("x", "residual", "gamma"))
def fused_rmsnorm(x, residual=None, gamma=None, *, eps: float, out_dtype=None, acc_dtype="float32"):
    *rows, N = x.shape
    dt = acc_dtype
    if residual is not None and [int(d) for d in residual.shape[-1:]] != [int(N)]:
        raise ValueError(f"fused_rmsnorm: residual {list(residual.shape)} does not match x {list(x.shape)}")
    if gamma is not None and (len(gamma.shape) != 1 or int(gamma.shape[0]) != int(N)):
        raise ValueError(f"fused_rmsnorm: gamma {list(gamma.shape)} is not a vector of width {N}")

    def row_input(*i):
        v = x[i].astype(dt)
        if residual is not None:
            v = v + residual[i].astype(dt)
        return v

    h = te.compute(x.shape, row_input, name="rms_input", attrs={"schedule_rule": "tfx.rmsnorm"})
    r = te.reduce_axis((0, N), name="r")
    sumsq = te.compute(tuple(rows), lambda *i: te.sum(h[(*i, r)] * h[(*i, r)], axis=r), name="rms_sumsq")
    inv_n = tirx.const(1.0 / int(N), dt)

    def normalise(*i):
        v = h[i] * tirx.rsqrt(sumsq[i[:-1]] * inv_n + tirx.const(eps, dt))
        if gamma is not None:
            v = v * gamma[i[-1]].astype(dt)
        return v.astype(out_dtype or x.dtype)

    return te.compute(x.shape, normalise, name="rms_output")
