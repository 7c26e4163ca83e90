"""The online softmax both attention forms fold with: a vectorisable fp32 ``exp`` and the (max, sum, numerator)
reducer (:mod:`.attention`, :mod:`.decode_attention`)."""

from __future__ import annotations

from tvm import te, tirx

ACC = "float32"


def fast_exp(x, bind: bool = True):
    """exp(x) for fp32 as a Cephes polynomial (≈1 ulp), so the exponentials vectorise.

    LLVM lowers a vector ``llvm.exp`` to one libm call per lane on x86 without a vector math library, which
    would cost more than the two matmuls of the kernel. Inputs are clamped to the finite fp32 range of exp;
    anything below -88.37 (including -inf and the lowest finite value) gives exactly 0.
    """
    c = lambda v: tirx.const(v, ACC)  # noqa: E731
    x = tirx.max(tirx.min(x, c(88.3762626647950)), c(-88.3762626647949))
    n = tirx.floor(x * c(1.44269504088896341) + c(0.5))
    # Let-bound so the argument and the exponent are computed once, not once per use in the polynomial.
    # An expression used in several outputs of one reduction must not bind (a Let var may be defined once);
    # there ``bind=False`` leaves the duplicates to common-subexpression elimination.
    xv, nv = (tirx.Var("exp_x", ACC), tirx.Var("exp_n", ACC)) if bind else (x, n)
    z = xv - nv * c(0.693359375) - nv * c(-2.12194440e-4)
    y = c(1.9875691500e-4)
    for coef in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        y = y * z + c(coef)
    y = y * z * z + z + c(1.0)
    two_n = tirx.reinterpret(ACC, tirx.shift_left(nv.astype("int32") + tirx.const(127, "int32"),
                                                    tirx.const(23, "int32")))
    if not bind:
        return y * two_n
    return tirx.Let(xv, x, tirx.Let(nv, tirx.floor(xv * c(1.44269504088896341) + c(0.5)), y * two_n))


def online_softmax_reducer():
    """The online-softmax fold of (max, sum, numerator) triples: ``te.comm_reducer`` over three values."""
    f32 = lambda x: tirx.const(x, ACC)  # noqa: E731

    def combine(x, y):
        # one of the two rescale factors is exactly 1 (the side holding the max): one exp, not two
        x_wins = x[0] >= y[0]
        e = fast_exp(tirx.min(x[0], y[0]) - tirx.max(x[0], y[0]), bind=False)
        ex = tirx.Select(x_wins, f32(1.0), e)
        ey = tirx.Select(x_wins, e, f32(1.0))
        return tirx.max(x[0], y[0]), x[1] * ex + y[1] * ey, x[2] * ex + y[2] * ey

    return te.comm_reducer(combine, _identity, name="online_softmax")


def single_triple_reducer():
    """The fold of a reduction over one triple: that triple as it is. The online fold would give the same (the
    identity's sum and numerator are 0, and the triple's own factor is 1) after an exponential per element."""
    return te.comm_reducer(lambda x, y: y, _identity, name="single_triple")


def _identity(t0, t1, t2):
    # lowest finite, not -inf: exp(-inf - -inf) would be NaN
    return tirx.min_value(t0), tirx.const(0, t1), tirx.const(0, t2)
