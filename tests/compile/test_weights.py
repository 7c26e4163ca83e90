"""``lift_weights``: large constants of ``main`` become trailing parameters, small ones stay, a constant used
twice is one parameter, and the lifted module computes what the original computes."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvm_fusion_ext.compile.codegen.weights import LIFT_MIN_BYTES, NUM_INPUT_ATTR, lift_weights
from tvm_fusion_ext.testing import build_module


def _module():
    rng = np.random.default_rng(0)
    big = rng.standard_normal((16, 32)).astype("float32")       # 2 KiB: lifted
    small = rng.standard_normal((32,)).astype("float32")        # 128 B: stays
    x = relax.Var("x", relax.TensorType([4, 16], "float32"))
    w = relax.const(big)

    def body(bb):
        h = bb.emit(relax.op.add(relax.op.matmul(x, w), relax.const(small)))
        return relax.op.add(h, relax.op.matmul(x, w))  # the same constant object, used twice

    return build_module([x], body), big, small


def _count_constants(func, min_bytes):
    found = []

    def visit(expr):
        if isinstance(expr, tvm.ir.GenericConst) and expr.value.numpy().nbytes >= min_bytes:
            found.append(expr)

    relax.analysis.post_order_visit(func.body, visit)
    return len(found)


def test_lift_large_constants_only_once_each():
    mod, big, small = _module()
    lifted_mod, weights = lift_weights(mod)
    main = lifted_mod["main"]
    assert [name for name, _ in weights] == ["weight_0"]
    np.testing.assert_array_equal(weights[0][1], big)
    assert [p.name for p in main.params] == ["x", "weight_0"]
    assert int(main.attrs[NUM_INPUT_ATTR]) == 1
    assert _count_constants(main, LIFT_MIN_BYTES) == 0 and _count_constants(main, 1) >= 1  # `small` stays
    assert _count_constants(mod["main"], LIFT_MIN_BYTES) == 2  # the caller's module is untouched


def test_lifted_module_computes_the_same():
    mod, big, _ = _module()
    lifted_mod, weights = lift_weights(mod)
    x = np.random.default_rng(1).standard_normal((4, 16)).astype("float32")
    target = tvm.target.Target({"kind": "llvm"})
    want = relax.VirtualMachine(tvm.compile(mod, target), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    got = relax.VirtualMachine(tvm.compile(lifted_mod, target), tvm.cpu())["main"](
        tvm.runtime.tensor(x), *[tvm.runtime.tensor(v) for _, v in weights]).numpy()
    np.testing.assert_array_equal(got, want)


def test_nothing_to_lift_returns_the_module():
    x = relax.Var("x", relax.TensorType([4], "float32"))
    mod = build_module([x], lambda bb: relax.op.add(x, relax.const(np.ones(4, "float32"))))
    out, weights = lift_weights(mod)
    assert weights == [] and out.same_as(mod)
