"""Symbolic CPU dense kernels branch to 1-, 2- and 4-row-tile variants for requests of a few rows
(compile/variants/short_rows.py): every branch against numpy at the row counts on both sides of each boundary, for the
dense, the gated dense and the int8 dense, and the kernels the pass must leave alone."""

import warnings

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from tvm_fusion_ext.compile.variants import short_rows
from tvm_fusion_ext.compile.pipeline import compile_model, prepare
from tvm_fusion_ext.compile.schedule import ApplyTemplates, schedule
from tvm_fusion_ext.ops import call_op
from tvm_fusion_ext.schedules.cpu.dense import symbolic_mr
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.testing import build_module

TARGET = resolve_target("llvm")
K, N = 48, 64
RNG = np.random.default_rng(0)
W = (RNG.standard_normal((K, N)) / np.sqrt(K)).astype("float32")
BIAS = RNG.standard_normal(N).astype("float32")
W_GATED = (RNG.standard_normal((K, N, 2)) / np.sqrt(K)).astype("float32")
#: (batch, seq): 1, 2, 3, 4, 5, 8, 9 and 14 rows, each side of every variant's bound and of the kernel's tile
SHAPES = ((1, 1), (2, 1), (1, 2), (3, 1), (1, 4), (2, 2), (1, 5), (2, 4), (3, 3), (2, 7))


def _module(op, batch=None, seq=None):
    batch = batch if batch is not None else tirx.Var("batch", "int64")
    seq = seq if seq is not None else tirx.Var("seq", "int64")
    x = relax.Var("x", relax.TensorType([batch, seq, K], "float32"))
    if op == "fused_dense":
        inputs, params = {"x": x, "w": relax.const(W), "bias": relax.const(BIAS)}, {"act": "gelu"}
    else:
        inputs, params = {"x": x, "w": relax.const(W_GATED)}, {"act": "silu"}
    return build_module([x], lambda bb: call_op(bb, op, inputs, params))


def _reference(op, x):
    x = x.astype("float64")
    if op == "fused_dense":
        from scipy.special import erf

        y = x @ W + BIAS
        return 0.5 * y * (1 + erf(y / np.sqrt(2)))
    gate, up = x @ W_GATED[..., 0], x @ W_GATED[..., 1]
    return gate / (1 + np.exp(-gate)) * up


def _kernel(mod, op):
    return next(f for gv, f in mod.functions_items()
                if isinstance(f, tirx.PrimFunc) and gv.name_hint.startswith(op))


@pytest.mark.parametrize("op", ["fused_dense", "fused_gated_dense"])
def test_every_branch_matches_numpy_on_both_sides_of_its_bound(op):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a template failure on a variant must not surface as a warning
        compiled = compile_model(_module(op), TARGET, fuse_graph=False)
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    for batch, seq in SHAPES:
        x = np.random.default_rng(batch * 10 + seq).standard_normal((batch, seq, K)).astype("float32")
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(got, _reference(op, x), rtol=1e-5, atol=1e-5,
                                   err_msg=f"{op} at (batch, seq) = ({batch}, {seq})")


@pytest.mark.parametrize("op", ["fused_dense", "fused_gated_dense"])
def test_the_kernel_branches_on_its_row_count(op):
    lowered = prepare(_module(op), TARGET, fuse_graph=False)[0]
    kernel = _kernel(schedule(lowered, TARGET), op)
    thinner = [rows for rows in short_rows.SHORT_ROW_BLOCKS if rows < symbolic_mr(TARGET)]  # AVX-512: 1, 2, 4
    assert str(kernel.attrs["tfx.short_row_blocks"]) == ",".join(map(str, thinner))
    assert '"row_block": %d' % symbolic_mr(TARGET) in str(kernel.attrs["tfx.params"])  # the kernel keeps its tile
    script = kernel.script()
    for rows in thinner:
        assert f"if batch * seq <= T.int64({rows}):" in script
    # one copy of the micro-kernel per variant, and the kernel's own
    block = 'T.sblock("dense_update")' if op == "fused_dense" else 'T.sblock("gated_dense_update")'
    assert script.count(block) == len(thinner) + 1


def test_a_four_row_tile_gets_the_one_and_two_row_variants():
    """AVX2's symbolic tile (4 rows), here through the ``mr`` knob: variants only where they are thinner."""
    lowered = prepare(_module("fused_dense"), TARGET, fuse_graph=False, knobs={"tfx.dense": {"mr": 4}})[0]
    kernel = _kernel(schedule(lowered, TARGET, knobs={"tfx.dense": {"mr": 4}}), "fused_dense")
    assert '"row_block": 4' in str(kernel.attrs["tfx.params"])
    assert str(kernel.attrs["tfx.short_row_blocks"]) == "1,2"
    compiled = compile_model(_module("fused_dense"), TARGET, fuse_graph=False, knobs={"tfx.dense": {"mr": 4}})
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    for batch, seq in ((1, 1), (1, 2), (3, 1), (2, 3)):
        x = np.random.default_rng(seq).standard_normal((batch, seq, K)).astype("float32")
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), _reference("fused_dense", x),
                                   rtol=1e-5, atol=1e-5, err_msg=f"({batch}, {seq})")
    one = _kernel(schedule(prepare(_module("fused_dense"), TARGET, fuse_graph=False,
                                   knobs={"tfx.dense": {"mr": 1}})[0], TARGET), "fused_dense")
    assert "tfx.short_row_blocks" not in one.attrs and short_rows._refusal(one) == "row tile 1 is already thin"


def test_static_rows_and_cuda_are_left_alone():
    static = _kernel(schedule(prepare(_module("fused_dense", 1, 3), TARGET, fuse_graph=False)[0], TARGET),
                     "fused_dense")
    assert "tfx.short_row_blocks" not in static.attrs  # a static kernel has the tile for its rows
    prime = _kernel(schedule(prepare(_module("fused_dense", 1, 197), TARGET, fuse_graph=False)[0], TARGET),
                    "fused_dense")
    assert "row_block" in str(prime.attrs["tfx.params"])  # padded to the tile at build time ...
    assert "tfx.short_row_blocks" not in prime.attrs      # ... with nothing left to choose at run time
    cuda = resolve_target("cuda:sm_80")
    kernel = _kernel(schedule(prepare(_module("fused_dense"), cuda, fuse_graph=False)[0], cuda), "fused_dense")
    assert "tfx.short_row_blocks" not in kernel.attrs  # CUDA's row tile is a thread block's


def test_a_variant_the_template_cannot_schedule_drops_the_branch_not_the_build(caplog):
    lowered = prepare(_module("fused_dense"), TARGET, fuse_graph=False)[0]
    plain = _kernel(ApplyTemplates(TARGET)(lowered), "fused_dense")  # scheduled, before the dispatch
    assert short_rows._refusal(plain) is None
    caplog.set_level("INFO", logger="tvm_fusion_ext.compile.variants.short_rows")
    assert short_rows.dispatch(plain, lambda mod: mod) is None  # as if no template took the variant
    assert "1-row variant was not scheduled by a template" in caplog.text

    def failing(mod):
        raise RuntimeError("boom")

    assert short_rows.dispatch(plain, failing) is None
    assert "failed: boom" in caplog.text


def test_some_variant_is_thinner_than_the_symbolic_tile():
    """The symbolic tile's height depends on the host's vector width (4 rows with AVX2, more with AVX-512):
    variants as tall as the tile are dropped, and at least one thinner variant remains on every host."""
    assert min(short_rows.SHORT_ROW_BLOCKS) < symbolic_mr(TARGET)
    assert list(short_rows.SHORT_ROW_BLOCKS) == sorted(short_rows.SHORT_ROW_BLOCKS)


#: wide enough that a task holds a group of column panels (dense: 64 panels of 16; gated: 128 of 8)
N_WIDE = 1024
TWO_CORES = resolve_target({"kind": "llvm", "num-cores": 2})


def _wide_module(op):
    rng = np.random.default_rng(1)
    x = relax.Var("x", relax.TensorType([tirx.Var("batch", "int64"), tirx.Var("seq", "int64"), K], "float32"))
    if op == "fused_dense":
        w = (rng.standard_normal((K, N_WIDE)) / np.sqrt(K)).astype("float32")
        inputs, params = {"x": x, "w": relax.const(w)}, {"act": "none"}
        reference = lambda a: a.astype("float64") @ w  # noqa: E731
    else:
        w = (rng.standard_normal((K, N_WIDE, 2)) / np.sqrt(K)).astype("float32")
        inputs, params = {"x": x, "w": relax.const(w)}, {"act": "silu"}

        def reference(a):
            gate, up = a.astype("float64") @ w[..., 0], a.astype("float64") @ w[..., 1]
            return gate / (1 + np.exp(-gate)) * up
    return build_module([x], lambda bb: call_op(bb, op, inputs, params)), reference


def test_side_by_side_panels_fill_the_accumulators_of_a_thin_tile():
    from tvm_fusion_ext.schedules.cpu.dense import side_by_side_panels

    assert side_by_side_panels(1, 8, 2) == 4  # one row: four 16-column panels, eight AVX2 accumulators
    assert side_by_side_panels(2, 8, 2) == 2
    assert side_by_side_panels(4, 8, 2) == 1  # a 4-row tile already has eight
    assert side_by_side_panels(1, 3, 2) == 3  # a divisor of the task's group
    assert side_by_side_panels(1, 1, 2) == 1


@pytest.mark.parametrize("op", ["fused_dense", "fused_gated_dense"])
def test_thin_tiles_reading_panels_side_by_side_match_numpy_and_every_row_count(op, monkeypatch):
    """The 1- and 2-row variants read several column panels per k step; each output still sums over K in the same
    order, so a row's values do not depend on how many rows came with it."""
    from tvm_fusion_ext.schedules.cpu import dense

    mod, reference = _wide_module(op)
    lowered = prepare(mod, TWO_CORES, fuse_graph=False)[0]
    side_by_side = _kernel(schedule(lowered, TWO_CORES), op).script()
    monkeypatch.setattr(dense, "THIN_TILE_ACCUMULATORS", 1)
    one_panel = _kernel(schedule(lowered, TWO_CORES), op).script()
    monkeypatch.undo()
    assert side_by_side != one_panel  # the thin variants' loop nests changed

    vm = relax.VirtualMachine(compile_model(mod, TWO_CORES, fuse_graph=False).executable, tvm.cpu())
    x = np.random.default_rng(2).standard_normal((1, 9, K)).astype("float32")
    first_rows = []
    for seq in (1, 2, 3, 9):
        got = vm["main"](tvm.runtime.tensor(np.ascontiguousarray(x[:, :seq]))).numpy()
        np.testing.assert_allclose(got, reference(x[:, :seq]), rtol=1e-5, atol=1e-5, err_msg=f"{op}, {seq} rows")
        first_rows.append(got[0, 0])
    for row in first_rows[1:]:
        np.testing.assert_array_equal(row, first_rows[0])


def _wide_dense_module(n=N_WIDE, seed=3):
    """A ``fused_dense`` over symbolic rows (the int8 build makes it ``fused_dense_int8``, the bf16 build a dense on
    bf16 weights) and the int8 build's numpy reference."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((K, n)) / np.sqrt(K)).astype("float32")
    b = rng.standard_normal(n).astype("float32")
    x = relax.Var("x", relax.TensorType([tirx.Var("batch", "int64"), tirx.Var("seq", "int64"), K], "float32"))
    mod = build_module([x], lambda bb: call_op(bb, "fused_dense", {"x": x, "w": relax.const(w),
                                                                   "bias": relax.const(b)}, {"act": "relu"}))

    def reference(a):  # per-row u8 activations, per-channel s8 weights, the integer dot product exactly
        from tvm_fusion_ext.ops.dense_int8 import quantize_weight
        from tvm_fusion_ext.testing import quantize_rows_reference

        aq, scale, zero = quantize_rows_reference(a)
        wq, w_scale, _ = quantize_weight(w)
        return np.maximum((aq - zero) @ wq.astype(np.float64) * scale * w_scale.astype(np.float64) + b, 0)
    return mod, reference


def _needs_avx2():
    from tvm_fusion_ext.deploy import host

    return pytest.mark.skipif("avx2" not in (host.cpu_flags() or set()),
                              reason="the int8 kernel runs on AVX2's vpmaddwd (this CPU lacks avx2, /proc/cpuinfo)")


@_needs_avx2()
def test_int8_dense_branches_to_thin_tiles_and_every_branch_matches_numpy(monkeypatch):
    """A decode step's one row per sequence: the int8 kernel, tiled like the float one, gets the same run-time
    choice, its thin tiles reading several column panels per k step (one dot-product accumulator per ``lanes``
    columns). Integer sums are exact, so a row's values do not depend on the tile that computed them."""
    from tvm_fusion_ext.schedules.cpu import dense

    mod, reference = _wide_dense_module()
    lowered = prepare(mod, TWO_CORES, fuse_graph=False, precision="int8")[0]
    kernel = _kernel(schedule(lowered, TWO_CORES), "fused_dense_int8")
    thinner = [rows for rows in short_rows.SHORT_ROW_BLOCKS if rows < symbolic_mr(TWO_CORES)]
    assert str(kernel.attrs["tfx.short_row_blocks"]) == ",".join(map(str, thinner))
    monkeypatch.setattr(dense, "THIN_TILE_ACCUMULATORS", 1)
    one_panel = _kernel(schedule(lowered, TWO_CORES), "fused_dense_int8").script()
    monkeypatch.undo()
    assert kernel.script() != one_panel  # the thin variants read panels side by side

    vm = relax.VirtualMachine(compile_model(mod, TWO_CORES, fuse_graph=False, precision="int8").executable,
                              tvm.cpu())
    x = (np.random.default_rng(4).standard_normal((1, 9, K)) + 0.3).astype("float32")
    first_rows = []
    for seq in (1, 2, 3, 4, 5, 9):
        got = vm["main"](tvm.runtime.tensor(np.ascontiguousarray(x[:, :seq]))).numpy()
        np.testing.assert_allclose(got, reference(x[:, :seq]), rtol=1e-5, atol=1e-4, err_msg=f"{seq} rows")
        first_rows.append(got[0, 0])
    for row in first_rows[1:]:
        np.testing.assert_array_equal(row, first_rows[0])


@pytest.mark.parametrize("mcpu,precision,op,instruction", [
    ("znver4", "int8", "fused_dense_int8", "vpdpbusd"), ("alderlake", "int8", "fused_dense_int8", "vpdpbusd"),
    ("x86-64-v3", "int8", "fused_dense_int8", "vpmaddwd"), ("znver4", "bf16", "fused_dense", "vdpbf16ps")])
def test_thin_tiles_compile_for_each_dot_product_instruction(mcpu, precision, op, instruction, caplog, monkeypatch):
    """Compiled for each CPU class (run nowhere): every thin variant takes the instruction (none dropped), its
    panels side by side."""
    from tvm_fusion_ext.schedules.cpu import dense

    target = resolve_target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    caplog.set_level("INFO", logger="tvm_fusion_ext.compile.variants.short_rows")
    mod = _wide_dense_module(n=1024)[0]
    lowered = prepare(mod, target, fuse_graph=False, precision=precision)[0]
    kernel = _kernel(schedule(lowered, target), op)
    thinner = [rows for rows in short_rows.SHORT_ROW_BLOCKS if rows < symbolic_mr(target)]
    assert str(kernel.attrs["tfx.short_row_blocks"]) == ",".join(map(str, thinner))
    monkeypatch.setattr(dense, "THIN_TILE_ACCUMULATORS", 1)
    assert _kernel(schedule(lowered, target), op).script() != kernel.script()
    monkeypatch.undo()
    compiled = compile_model(mod, target, fuse_graph=False, precision=precision)
    assert "no run-time branches" not in caplog.text
    assert instruction in compiled.executable.mod.imports[0].inspect_source("asm")
