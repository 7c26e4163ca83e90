"""Helpers for checking that a rewrite kept a module's meaning (used by our tests; handy in yours)."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np
import tvm
from tvm import relax

from .tools.reference import numpy_activation  # noqa: F401  (re-exported for tests)


def random_inputs(mod: tvm.IRModule, seed: int = 0, func: str = "main", int_high: int = 2) -> List[np.ndarray]:
    """One random array per parameter of ``mod[func]`` (floats ~N(0,1), ints in [0, int_high), bools random)."""
    rng = np.random.default_rng(seed)
    out = []
    for p in mod[func].params:
        shape = [int(d) for d in p.ty.shape.values]
        dtype = str(p.ty.dtype)
        if dtype == "bool":
            out.append(rng.random(shape) < 0.7)
        elif dtype.startswith(("int", "uint")):
            out.append(rng.integers(0, int_high, shape).astype(dtype))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


def run_relax(mod: tvm.IRModule, inputs: Sequence[np.ndarray], target: Optional[dict] = None,
              func: str = "main"):
    """Compile with stock ``tvm.compile`` on llvm (no scheduling: a reference, not a fast path) and run."""
    tgt = tvm.target.Target(target or {"kind": "llvm"})
    ex = tvm.compile(mod, tgt)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    result = vm[func](*[tvm.runtime.tensor(np.ascontiguousarray(a).reshape(np.shape(a))) for a in inputs])
    return _to_numpy(result)


def _to_numpy(result):
    if hasattr(result, "numpy"):
        return result.numpy()
    return [_to_numpy(r) for r in result]


def assert_allclose_nested(actual, expected, rtol=1e-5, atol=1e-5):
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_allclose_nested(a, e, rtol, atol)
    else:
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


def fused_calls(mod: tvm.IRModule, func: str = "main") -> Dict[str, int]:
    """Count ``call_tir``s in ``mod[func]`` by the fused operator they call (PrimFunc attr ``tfx.op``)."""
    from .ops import op_of

    counts: Dict[str, int] = {}
    for binding in _bindings(mod[func]):
        v = binding.value
        if isinstance(v, relax.Call) and v.op.same_as(tvm.ir.Op.get("relax.call_tir")):
            name = op_of(mod[v.args[0]])
            if name:
                counts[name] = counts.get(name, 0) + 1
    return counts


def tensor_shapes(mod: tvm.IRModule, func: str = "main") -> List[List[int]]:
    """Static shapes of every tensor bound in ``mod[func]`` (to prove e.g. no S×S tensor is left)."""
    shapes = []
    for binding in _bindings(mod[func]):
        ty = binding.var.ty
        if isinstance(ty, relax.TensorType) and ty.shape is not None:
            try:
                shapes.append([int(d) for d in ty.shape.values])
            except TypeError:
                continue
    return shapes


def _bindings(func):
    for block in func.body.blocks:
        yield from block.bindings
