"""A split into equal parts is one loop nest (one parallel region on CPU); other splits keep TVM's legalization."""

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from tvm_fusion_ext.compile import lower
from tvm_fusion_ext.compile.pipeline import compile_model
from tvm_fusion_ext.compile.schedule import schedule
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.testing import build_module

TARGET = resolve_target("llvm")


def _split_module(shape, sections, axis):
    x = relax.Var("x", relax.TensorType(shape, "float32"))

    def body(bb):
        parts = bb.emit(relax.op.split(x, sections, axis=axis))
        n = len(parts.ty.fields)
        return bb.emit(relax.Tuple([bb.emit(relax.TupleGetItem(parts, i)) for i in range(n)]))

    return build_module([x], body)


def _parallel_loops(func) -> int:
    return func.script().count("T.parallel(")


def _split_funcs(mod):
    return [f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc) and "split" in gv.name_hint]


def _run(mod, x):
    vm = relax.VirtualMachine(compile_model(mod, TARGET, fuse_graph=False).executable, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x))
    return [out[i].numpy() for i in range(len(out))]


SYMBOLIC = [tirx.Var("batch", "int64"), tirx.Var("seq", "int64"), 1152]


@pytest.mark.parametrize("sections", [3, [384, 768]], ids=["sections", "indices"])
def test_equal_qkv_split_runs_in_one_parallel_region(sections):
    mod = _split_module(SYMBOLIC, sections, -1)
    (func,) = _split_funcs(schedule(lower(mod, TARGET), TARGET))
    assert _parallel_loops(func) == 1
    rng = np.random.default_rng(0)
    for b, s in ((1, 1), (2, 7), (3, 16)):
        x = rng.standard_normal((b, s, 1152)).astype("float32")
        for got, want in zip(_run(mod, x), np.split(x, 3, axis=-1)):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape, sections, axis", [
    ([tirx.Var("n", "int64"), 48], [10, 30], 1),      # unequal parts
    ([tirx.Var("n", "int64"), 48], 2, 0),              # a symbolic axis: TVM's legalization
    ([6, 4, 10], 3, 0),                               # equal parts of a static leading axis
    ([6, 4, 10], [2, 4], 0),                          # the same, as indices
], ids=["unequal", "symbolic-axis", "leading-axis", "leading-axis-indices"])
def test_other_splits_match_numpy(shape, sections, axis):
    mod = _split_module(shape, sections, axis)
    rows = 6 if not isinstance(shape[0], int) else shape[0]
    x = np.random.default_rng(1).standard_normal([rows] + [d for d in shape[1:]]).astype("float32")
    want = np.split(x, sections, axis=axis)
    got = _run(mod, x)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_unequal_split_keeps_one_loop_nest_per_part():
    mod = _split_module([tirx.Var("n", "int64"), 48], [10, 30], 1)
    (func,) = _split_funcs(schedule(lower(mod, TARGET), TARGET))
    assert _parallel_loops(func) == 3
