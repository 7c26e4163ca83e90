"""Each run-time shape is made once per call (compile/codegen/shape_reuse.py), and never reused outside the branch that made
it."""

import re

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.script import relax as R
from tvm.script import tirx as T

from tvm_fusion_ext.compile.pipeline import compile_model
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.testing import build_module

TARGET = resolve_target("llvm")
SHAPE_CALL = re.compile(r"call\s+vm\.builtin\.(make_shape|make_prim_value)\s+in:\s*(.*?)\s+dst:")


def _shape_calls(executable):
    """(builtin, arguments) of every shape call in the VM code, per function (registers are function-local)."""
    calls, func = [], None
    for line in executable.as_text().splitlines():
        if line.startswith("@"):
            func = line
        match = SHAPE_CALL.search(line)
        if match:
            calls.append((func,) + match.groups())
    return calls


def _matmul_chain():
    """Three matmuls of ``x: float32[batch, seq, 16]``: each output is another tensor of shape (batch, seq, 16)."""
    batch, seq = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    x = relax.Var("x", relax.TensorType([batch, seq, 16], "float32"))
    ws = [np.random.default_rng(i).standard_normal((16, 16)).astype("float32") / 4 for i in range(3)]

    def body(bb):
        h = x
        for w in ws:
            h = bb.emit(relax.op.matmul(h, relax.const(w)))
        return h

    mod = build_module([x], body)
    mod["main"] = mod["main"].with_attr("tir_var_upper_bound", {"batch": 4, "seq": 32})
    return mod, ws


def test_every_shape_is_made_once_per_call():
    mod, ws = _matmul_chain()
    ex = compile_model(mod, TARGET, fuse_graph=False).executable
    calls = _shape_calls(ex)
    assert calls, "a symbolic build makes shapes at run time"
    assert len(calls) == len(set(calls)), "a shape made twice in one call"
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(0)
    for b, s in ((1, 1), (2, 5), (3, 32)):
        x = rng.standard_normal((b, s, 16)).astype("float32")
        want = x.astype("float64")
        for w in ws:
            want = want @ w
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), want, atol=1e-5, rtol=1e-5)


def _branching_module():
    @R.function
    def main(x: R.Tensor(("n",), "float32"), flag: R.Tensor((), "bool")):
        n = T.int64()
        if flag:
            y = R.add(x, x)
        else:
            y = R.multiply(x, x)
        z = R.add(y, x)
        return R.add(z, R.ones(R.shape([n]), "float32"))

    return tvm.IRModule({"main": main.with_attr("tir_var_upper_bound", {"n": 32})})


def test_a_shape_made_in_a_branch_is_not_reused_after_it():
    ex = compile_model(_branching_module(), TARGET, fuse_graph=False).executable
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = np.arange(1, 6, dtype="float32")
    for flag, y in ((True, x + x), (False, x * x)):
        got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(np.array(flag))).numpy()
        np.testing.assert_array_equal(got, y + x + 1)
