"""LayerNorm spelt out as reductions and elementwise ops → ``R.nn.layer_norm``.

Pattern (what TVM's ONNX importer makes of an opset < 17 export, and of ``InstanceNormalization``: wav2vec2's
GroupNorm with a group per channel normalises each channel's row, then scales it per channel, which stays an
elementwise op after the ``layer_norm``)::

    mu = mean(x, axis=[-1], keepdims=True);  d = x - mu
    var = mean(d ** 2  |  d * d, axis=[-1], keepdims=True)  |  variance(x, axis=[-1], keepdims=True)
    n = d / sqrt(var + eps)  |  d * rsqrt(var + eps)
    y = n * gamma + beta  |  n * gamma  |  n

``d`` is one pattern object used twice, so both uses must be the same binding. Affine forms come first so the
largest match wins; without gamma/beta the replacement gets ones/zeros.
Check: both means reduce exactly the last axis and keep it; the exponent is 2; eps is a positive scalar;
gamma/beta hold one value per feature (shape ``[N]``, leading 1s allowed).
Rewrite: ``layer_norm(x, gamma, beta, axes=[-1], epsilon=eps)``.
"""

from __future__ import annotations

import itertools
from typing import List, Optional

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from ..graph import const_value, format_dims, is_constant, same_dim
from ..rule import FusionRule, Match, Variant
from ._elementwise import check_keeps_type, first_reason


class DecomposedLayerNormToLayerNorm(FusionRule):
    name = "DecomposedLayerNormToLayerNorm"
    kind = "canonical"

    def variants(self) -> List[Variant]:
        x, two, eps, gamma, beta = wildcard(), is_const(), is_const(), wildcard(), wildcard()
        mu = is_op("relax.mean")(x)
        d = is_op("relax.subtract")(x, mu)
        variances = {
            "mean of squares": (is_op("relax.mean")(is_op("relax.power")(d, two) | is_op("relax.multiply")(d, d)),
                                {"two": two}),
            "variance": (is_op("relax.variance")(x), {}),
        }
        norms = {"sqrt": lambda v: is_op("relax.divide")(d, is_op("relax.sqrt")(v)),
                 "rsqrt": lambda v: is_op("relax.multiply")(d, is_op("relax.rsqrt")(v))}
        out = []
        for affine, (var_kind, (var, var_names)), (kind, norm) in itertools.product(
                ("gamma+beta", "gamma", "none"), variances.items(), norms.items()):
            names = {"x": x, "mu": mu, "var": var, "eps": eps, **var_names}
            root = norm(is_op("relax.add")(var, eps))
            if affine != "none":
                root = is_op("relax.multiply")(root, gamma)
                names["gamma"] = gamma
            if affine == "gamma+beta":
                root = is_op("relax.add")(root, beta)
                names["beta"] = beta
            out.append(Variant(root, names, {"affine": affine, "norm": kind, "variance": var_kind}))
        return out

    def check(self, m: Match) -> Optional[str]:
        x_ty = m["x"].ty
        if not isinstance(x_ty, relax.TensorType) or x_ty.ndim < 1 or x_ty.shape is None:
            return "x has no known rank and shape"
        if not str(x_ty.dtype).startswith(("float", "bfloat")):
            return f"x is {x_ty.dtype}, not floating point"
        return first_reason(
            _last_axis_mean(m["mu"], x_ty.ndim, "mean"),
            _last_axis_mean(m["var"], x_ty.ndim, "variance"),
            _exponent(m),
            _eps(m),
            *(_per_feature(m, k) for k in ("gamma", "beta") if m.has(k)),
            check_keeps_type(m),
        )

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        x = m.arg("x")
        n = x.ty.shape[-1]
        dtype = str(x.ty.dtype)
        gamma = _as_vector(m.arg("gamma"), n) if m.has("gamma") else _filled(1.0, n, dtype)
        beta = _as_vector(m.arg("beta"), n) if m.has("beta") else _filled(0.0, n, dtype)
        return relax.op.nn.layer_norm(x, gamma, beta, axes=[-1], epsilon=float(m.scalar("eps")))

    def describe(self, m: Match) -> str:
        return f"affine={m.tag['affine']}, norm={m.tag['norm']}, eps={m.scalar('eps'):.3g}"


def _last_axis_mean(call: relax.Call, ndim: int, what: str) -> Optional[str]:
    axes = None if call.attrs.axis is None else [int(a) for a in call.attrs.axis]
    if axes is None or len(axes) != 1 or axes[0] % ndim != ndim - 1:
        return f"{what} reduces axes {axes}, not only the last axis of a rank-{ndim} input"
    if not call.attrs.keepdims:
        return f"{what} does not keep the reduced axis"
    return None


def _exponent(m: Match) -> Optional[str]:
    if not m.has("two"):  # d * d
        return None
    value = m.scalar("two")
    if value is None or value != 2.0:
        return f"variance uses exponent {value if value is not None else 'non-scalar'}, not 2"
    return None


def _eps(m: Match) -> Optional[str]:
    value = m.scalar("eps")
    if value is None:
        return "eps is not a scalar constant"
    if not value > 0.0:
        return f"eps is {value:g}, not positive"
    return None


def _per_feature(m: Match, name: str) -> Optional[str]:
    """gamma/beta must be one value per feature: shape ``[..., 1, N]`` with N the last dim of x."""
    x_shape, ty = m["x"].ty.shape, m[name].ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return f"{name} has no known shape"
    if str(ty.dtype) != str(m["x"].ty.dtype):
        return f"{name} is {ty.dtype}, x is {m['x'].ty.dtype}"
    dims = list(ty.shape.values)
    ok = (0 < len(dims) <= len(x_shape.values)
          and same_dim(dims[-1], x_shape[-1])
          and all(same_dim(d, 1) for d in dims[:-1]))
    if not ok:
        return f"{name} has shape {format_dims(dims)}, expected {format_dims([x_shape[-1]])} (one value per feature)"
    return None


def _as_vector(e: relax.Expr, n) -> relax.Expr:
    if e.ty.ndim == 1:
        return e
    if is_constant(e):  # keep weights constant for later rules and FoldConstant-free builds
        return relax.const(const_value(e).reshape(-1))
    return relax.op.reshape(e, [n])


def _filled(value: float, n, dtype: str) -> relax.Expr:
    if isinstance(n, tvm.tirx.IntImm):
        try:
            return relax.const(np.full((int(n),), value, dtype=dtype))
        except TypeError:  # dtype numpy cannot hold (bfloat16 without ml_dtypes)
            pass
    make = relax.op.ones if value == 1.0 else relax.op.zeros
    return make(relax.ShapeExpr([n]), dtype)
