"""fp32 transcendental functions written as plain arithmetic, so that they vectorise on CPU.

LLVM lowers ``erf``/``exp`` (and TVM's ``sigmoid``/``tanh``, which go through ``exp``) to one scalar libm
call per vector lane; at MiniLM's shapes that made a GELU epilogue cost as much as its GEMM and a softmax
over 12×128×128 take milliseconds. These are the approximations TVM's own ``fast_erf``/``fast_exp`` use
(Eigen / Cephes), accurate to a few fp32 ulp. Other dtypes keep the exact intrinsic.
"""

from __future__ import annotations

from tvm import tirx

# erf on [-4, 4] as x * P(x²) / Q(x²); |x| > 4 is ±1 to fp32 precision.
_ERF_ALPHA = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
              -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_BETA = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
             -1.42647390514189e-02)
# exp: 2^n * e^f with n = round(x / ln 2), |f| <= ln2 / 2, e^f by a degree-7 polynomial.
_EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
_EXP_HI, _EXP_LO = 88.3762626647950, -88.3762626647949


def _is_f32(v) -> bool:
    return str(v.ty) == "float32"


def _c(v, x):
    return tirx.const(x, v.ty)


def _horner(v, coeffs):
    p = _c(v, coeffs[0])
    for a in coeffs[1:]:
        p = p * v + _c(v, a)
    return p


def erf(v):
    if not _is_f32(v):
        return tirx.erf(v)
    x = tirx.max(tirx.min(v, _c(v, 4.0)), _c(v, -4.0))
    x2 = x * x
    return x * _horner(x2, _ERF_ALPHA) / _horner(x2, _ERF_BETA)


def exp(v):
    if not _is_f32(v):
        return tirx.exp(v)
    x = tirx.max(tirx.min(v, _c(v, _EXP_HI)), _c(v, _EXP_LO))
    n = tirx.floor(x * _c(v, 1.44269504088896341) + _c(v, 0.5))
    f = x - n * _c(v, 0.6931471805599453)
    y = _horner(f, _EXP_P) * f * f + f + _c(v, 1.0)
    two_n = tirx.reinterpret("float32", tirx.shift_left((n + _c(v, 127.0)).astype("int32"), tirx.const(23, "int32")))
    # below the clamp the result is ~1e-38 rather than 0: harmless for softmax/sigmoid, and -inf stays finite.
    return two_n * y


def sigmoid(v):
    if not _is_f32(v):
        return tirx.sigmoid(v)
    return _c(v, 1.0) / (_c(v, 1.0) + exp(-v))


def tanh(v):
    if not _is_f32(v):
        return tirx.tanh(v)
    # tanh(x) = sign(x) (1 - e^{-2|x|}) / (1 + e^{-2|x|}): no overflow for either sign.
    e = exp(_c(v, -2.0) * tirx.abs(v))
    t = (_c(v, 1.0) - e) / (_c(v, 1.0) + e)
    return tirx.Select(v < _c(v, 0.0), -t, t)


#: intrinsic name -> replacement, for rewriting whole PrimFuncs (see ``build.VectorisableMath``).
REPLACEMENTS = {"tirx.erf": erf, "tirx.exp": exp, "tirx.sigmoid": sigmoid, "tirx.tanh": tanh}
