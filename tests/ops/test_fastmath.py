"""The vectorisable fp32 exp/erf/sigmoid/tanh against numpy, including the clamped extremes."""

import math

import numpy as np
import pytest
import tvm
from tvm import te

from tvm_fusion_ext.ops import fastmath

_REF = {"exp": np.exp, "erf": np.vectorize(math.erf), "sigmoid": lambda v: 1 / (1 + np.exp(-v)), "tanh": np.tanh}
_X = np.concatenate([np.linspace(-10, 10, 4001), [-1e30, -200.0, -88.0, -1e-6, 0.0, 1e-6, 60.0, 88.0, 1e30]])


@pytest.mark.parametrize("name", sorted(_REF))
def test_matches_numpy(name):
    x = te.placeholder((len(_X),), "float32", name="x")
    y = te.compute(x.shape, lambda i: getattr(fastmath, name)(x[i] + tvm.tirx.const(0.0, "float32")), name="y")
    lib = tvm.compile(te.create_prim_func([x, y]), target="llvm")
    xs = _X.astype("float32")
    out = tvm.runtime.tensor(np.zeros_like(xs))
    lib(tvm.runtime.tensor(xs), out)
    with np.errstate(over="ignore"):
        want = _REF[name](xs.astype("float64"))
    got = out.numpy().astype("float64")
    finite = np.isfinite(want) & (np.abs(want) < 1e38)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-6, atol=1e-7)
    assert not np.isnan(got).any()


def test_other_dtypes_keep_the_exact_intrinsic():
    v = tvm.tirx.Var("v", "float64")
    assert "exp" in str(fastmath.exp(v)) and "erf" in str(fastmath.erf(v))
