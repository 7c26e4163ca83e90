"""Graph-reading helpers: bindings looked through, users, and shapes static or symbolic."""

import numpy as np
from tvm import relax, tirx

from tvm_fusion_ext.testing import build_module
from tvm_fusion_ext.transform.graph import (FunctionGraph, const_value, format_dims, op_name, same_dim, shape_dims,
                                            static_shape, uniform_value)


def test_value_users_and_positions():
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))

    def build(bb):
        e = bb.emit(relax.op.exp(x))
        alias = bb.emit(e)  # an a = b binding
        return relax.Tuple([bb.emit(relax.op.negative(alias)), e])

    graph = FunctionGraph(build_module([x], build)["main"])
    e, alias, n, out = (b.var for b in graph.func.body.blocks[0].bindings)
    assert op_name(graph.value(alias)) == "relax.exp"  # through the alias to the call
    assert [v.name for v in graph.chain(alias)] == [alias.name, e.name]
    assert graph.users(e) == {alias, out}
    assert graph.users(alias) == {n}
    assert graph.users(out) == {None}  # None: the function result
    assert graph.position[n] == (0, 2)
    assert graph.var_of(graph.var2val[n]).same_as(n)


def test_symbolic_dims_are_kept_by_shape_dims_only():
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((1, n, 384), "float32"))
    dims = shape_dims(x)
    assert dims[0] == 1 and dims[2] == 384 and dims[1].same_as(n)
    assert static_shape(x) is None  # today's static callers refuse it as before
    assert static_shape(relax.Var("y", relax.TensorType((1, 8, 384), "float32"))) == [1, 8, 384]
    assert shape_dims(relax.Var("z", relax.TensorType(None, "float32", ndim=2))) is None
    assert same_dim(dims[1], n) and same_dim(dims[2], 384) and not same_dim(dims[1], 384)
    assert not same_dim(n, tirx.Var("m", "int64"))
    assert format_dims(dims) == "[1, n, 384]"


def test_constant_values():
    assert uniform_value(relax.const(np.full((2, 3), 0.5, "float32"))) == 0.5
    assert uniform_value(relax.const(np.array([0.5, 0.25], "float32"))) is None
    assert uniform_value(relax.const(np.full((2,), np.nan, "float32"))) != uniform_value(relax.const(1.0))
    assert const_value(relax.Var("v", relax.TensorType((2,), "float32"))) is None
