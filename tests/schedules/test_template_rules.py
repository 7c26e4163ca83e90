"""Templates as dlight rules: where each applies, when it declines, typed knobs, the one scheduling loop with the
fallback last, and kernels no rule knows (no root block) going through without a crash."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax, s_tir, te
from tvm.s_tir.dlight import ScheduleRule

from tvm_fusion_ext.compile import ApplyTemplates, build, lower
from tvm_fusion_ext.errors import FusionExtError
from tvm_fusion_ext.ops import call_op, make_prim_func
from tvm_fusion_ext.runtime import CompiledModel
from tvm_fusion_ext.schedules import fallback_rules, get_template, registered, template_rules
from tvm_fusion_ext.schedules.cpu.dense import DenseCPU
from tvm_fusion_ext.targets import TargetInfo, resolve_target
from tvm_fusion_ext.schedules.cpu.dense import symbolic_mr

CPU = resolve_target("llvm")
CUDA = resolve_target("cuda:sm_80")


def _dense_func(m=16, k=32, n=24):
    types = {"x": relax.TensorType((m, k), "float32"), "w": relax.TensorType((k, n), "float32")}
    return make_prim_func("fused_dense", types, {"act": "relu", "transpose_b": False})


_OPERATOR_RULES = ("tfx.dense", "tfx.gated_dense", "tfx.attention", "tfx.decode_attention", "tfx.layernorm",
                   "tfx.rmsnorm")
#: operator forms only the CPU builds (int8's fused row quantisation; CUDA keeps the stock ops)
_CPU_ONLY_RULES = ("tfx.quantize_rows",)


def test_one_template_per_operator_and_family():
    table = registered()
    for family in ("cpu", "cuda"):
        for rule in _OPERATOR_RULES + (_CPU_ONLY_RULES if family == "cpu" else ()):
            template = table[(rule, family)]
            assert isinstance(template, ScheduleRule) and template.family == family and template.block_rule == rule
    assert [t.family for t in template_rules(CPU)] == ["cpu"] * len(_OPERATOR_RULES + _CPU_ONLY_RULES)
    assert [t.family for t in template_rules(CUDA)] == ["cuda"] * len(_OPERATOR_RULES)


def test_template_applies_only_to_its_block_and_family():
    func = _dense_func()
    assert get_template("tfx.dense", CPU).apply(func, CPU, False) is not None
    assert get_template("tfx.layernorm", CPU).apply(func, CPU, False) is None  # not its operator
    assert get_template("tfx.dense", CUDA).apply(func, CPU, False) is None  # not its family


def test_template_declines_a_symbolic_reduction_and_the_fallback_schedules_it():
    k = tvm.tirx.Var("k", "int64")
    x = te.placeholder((16, k), "float32", name="x")
    w = te.placeholder((k, 24), "float32", name="w")
    r = te.reduce_axis((0, k), name="r")
    y = te.compute((16, 24), lambda i, j: te.sum(x[i, r] * w[r, j], axis=r), name="dense",
                   attrs={"schedule_rule": "tfx.dense"})
    func = te.create_prim_func([x, w, y])
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    template = get_template("tfx.dense", CPU)
    assert "reduction extent k is symbolic" in template.decline(sch, template.find_block(sch), CPU)
    assert template.apply(func, CPU, False) is None
    scheduled = ApplyTemplates(CPU)(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))
    assert bool(scheduled["main"].attrs["tirx.is_scheduled"])  # the fallback took it
    lib = tvm.compile(scheduled, target=CPU)
    xs = np.random.default_rng(0).standard_normal((16, 40)).astype("float32")
    ws = np.random.default_rng(1).standard_normal((40, 24)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((16, 24), "float32"))
    lib(tvm.runtime.tensor(xs), tvm.runtime.tensor(ws), out)
    np.testing.assert_allclose(out.numpy(), xs @ ws, rtol=1e-5, atol=1e-5)


def _gelu_dense_module(x_shape, w, b):
    """``gelu(x @ w + b)`` as one fused_dense call over an ``x`` of ``x_shape`` (plain weights)."""
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(call_op(bb, "fused_dense", {"x": x, "w": relax.const(w), "bias": relax.const(b)},
                                       {"act": "gelu", "transpose_b": False}))
        bb.emit_func_output(y)
    return bb.get()


@pytest.mark.parametrize("n", [48, 512])  # 512: 32 column panels, run 4 per task (panel_group)
def test_symbolic_rows_take_the_dense_template_padded_to_its_register_tile(n):
    """Rows known at run time (batch × sequence): the operator accumulates over rows padded to the template's
    register tile (row_block) and writes back only the real rows, checked at sizes that are not multiples
    of the tile."""
    from tvm_fusion_ext.ops import op_of, params_of

    batch, seq = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")
    rng = np.random.default_rng(2)
    w, b = rng.standard_normal((32, n)).astype("float32"), rng.standard_normal(n).astype("float32")
    mod = _gelu_dense_module((batch, seq, 32), w, b)
    kernels = [f for _, f in lower(mod, CPU).functions_items() if isinstance(f, tvm.tirx.PrimFunc) and op_of(f)]
    assert [params_of(f).get("row_block") for f in kernels] == [symbolic_mr(CPU)]  # 4 on AVX2, 8 on AVX-512
    scheduled = ApplyTemplates(CPU, fallback=False)(lower(mod, CPU))
    assert all(bool(f.attrs["tirx.is_scheduled"]) for _, f in scheduled.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and op_of(f))  # the template took the symbolic kernel
    vm = relax.VirtualMachine(build(mod, CPU, fuse=False), tvm.cpu())
    from tvm_fusion_ext.testing import numpy_activation

    for shape in ((1, 1), (2, 5), (3, 17)):
        xs = rng.standard_normal((*shape, 32)).astype("float32")
        got = vm["main"](tvm.runtime.tensor(xs)).numpy()
        want = numpy_activation(xs.astype("float64") @ w + b, "gelu")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tokens", [4, 50, 2])
def test_symbolic_batch_of_static_rows_sharing_a_factor_with_the_tile_takes_the_template(tokens):
    """A dynamic batch of a fixed number of rows (MobileViT's 4 pixels per patch, CLIP's 50 tokens): padded to the
    usual tile, ``(4b + 7) // 8`` is canonicalised to ``(b + 1) // 2`` and TVM's schedule state cannot prove the
    real rows inside the padded ones (the template failed, the fallback ran). The tile is moved to a divisor of the
    rows or one coprime with them; the template takes the kernel and the results are right."""
    from tvm_fusion_ext.ops import op_of, params_of
    from tvm_fusion_ext.schedules.cpu.dense import provable_row_block
    from tvm_fusion_ext.testing import numpy_activation

    batch = tvm.tirx.Var("batch", "int64")
    rng = np.random.default_rng(4)
    w, b = rng.standard_normal((32, 48)).astype("float32"), rng.standard_normal(48).astype("float32")
    mod = _gelu_dense_module((batch, tokens, 32), w, b)
    tile = provable_row_block(tokens, symbolic_mr(CPU))
    assert tokens % tile == 0 or np.gcd(tokens, tile) == 1
    kernels = [f for _, f in lower(mod, CPU).functions_items() if isinstance(f, tvm.tirx.PrimFunc) and op_of(f)]
    assert [params_of(f).get("row_block") for f in kernels] == [tile]
    scheduled = ApplyTemplates(CPU, fallback=False)(lower(mod, CPU))
    assert all(bool(f.attrs["tirx.is_scheduled"]) for _, f in scheduled.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and op_of(f))
    vm = relax.VirtualMachine(build(mod, CPU, fuse=False), tvm.cpu())
    for n in (1, 3):
        xs = rng.standard_normal((n, tokens, 32)).astype("float32")
        got = vm["main"](tvm.runtime.tensor(xs)).numpy()
        np.testing.assert_allclose(got, numpy_activation(xs.astype("float64") @ w + b, "gelu"), rtol=1e-4, atol=1e-4)


def test_provable_row_block_keeps_the_tile_where_it_proves():
    from tvm_fusion_ext.schedules.cpu.dense import provable_row_block

    assert [provable_row_block(c, 8) for c in (1, 3, 16, 197)] == [8, 8, 8, 8]  # no common factor, or a multiple
    assert [provable_row_block(c, 8) for c in (4, 12, 50, 2)] == [4, 6, 5, 7]  # a divisor near 8, else coprime
    assert [provable_row_block(c, 4) for c in (2, 6)] == [5, 6]


@pytest.mark.parametrize("rows,padded", [((197,), True), ((1, 197), True), ((2, 197), True), ((128,), False),
                                         ((1, 198), False), ((5,), False)])
def test_static_rows_without_a_divisor_near_the_tile_are_padded_to_it(rows, padded):
    """197 rows (ViT's patches + CLS) are prime: an exact tiling would give 1-row register tiles. They are
    padded to the symbolic tile instead; 2 × 197 = 394 (tiles of 2) too; 128, 198 (tiles of 6) and a handful of
    rows are not."""
    from tvm_fusion_ext.ops import op_of, params_of
    from tvm_fusion_ext.testing import numpy_activation

    rng = np.random.default_rng(3)
    w, b = rng.standard_normal((40, 48)).astype("float32"), rng.standard_normal(48).astype("float32")
    x = relax.Var("x", relax.TensorType((*rows, 40), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(call_op(bb, "fused_dense", {"x": x, "w": relax.const(w), "bias": relax.const(b)},
                                       {"act": "gelu"}))
        bb.emit_func_output(y)
    mod = bb.get()
    kernels = [f for _, f in lower(mod, CPU).functions_items() if isinstance(f, tvm.tirx.PrimFunc) and op_of(f)]
    assert [params_of(f).get("row_block") for f in kernels] == [symbolic_mr(CPU) if padded else None]
    vm = relax.VirtualMachine(build(mod, CPU, fuse=False), tvm.cpu())
    xs = rng.standard_normal((*rows, 40)).astype("float32")
    got = vm["main"](tvm.runtime.tensor(xs)).numpy()
    np.testing.assert_allclose(got, numpy_activation(xs.astype("float64") @ w + b, "gelu"), rtol=1e-4, atol=1e-4)


def test_panel_group_streams_x_once_per_group_and_keeps_tasks_for_every_core():
    from tvm_fusion_ext.schedules.cpu.dense import PANEL_GROUP_BYTES, panel_group

    assert panel_group(6, 4096, 2) == 1  # too few panels to share among 2 cores
    assert panel_group(32, 4096, 2) == 4  # 8 tasks left
    assert panel_group(192, 768 * 16 * 4, 2) == 8  # BERT-base FFN up: 8 panels of 48 KiB
    assert panel_group(48, 3072 * 16 * 4, 2) * 3072 * 16 * 4 <= PANEL_GROUP_BYTES  # FFN down: K = 3072
    # MiniLM's QKV projection, 36 panels of 32 columns: groups of 4 would be 9 tasks, 5 on one core, 4 on the other
    assert panel_group(36, 384 * 32 * 4, 2) == 3
    assert panel_group(36, 384 * 32 * 4, 3) == 3  # 12 tasks: 4 per core
    assert panel_group(18, 4096, 2) == 1  # groups of 2 would be 9 tasks; one panel per task is 18


def test_symbolic_dense_reads_its_rows_in_place():
    """The padded rows of a symbolic dense are read from x where it lies (clamped to the last real row), not copied
    into a workspace by a loop of their own: the scheduled kernel has one parallel loop and no ``dense_rows``
    block, and the results at row counts on both sides of the tile still match numpy."""
    from tvm_fusion_ext.ops import op_of
    from tvm_fusion_ext.testing import numpy_activation

    batch, seq = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")
    rng = np.random.default_rng(5)
    w, b = rng.standard_normal((64, 96)).astype("float32"), rng.standard_normal(96).astype("float32")
    mod = _gelu_dense_module((batch, seq, 64), w, b)
    scheduled = ApplyTemplates(CPU, fallback=False)(lower(mod, CPU))
    [kernel] = [f for _, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc) and op_of(f)]
    text = kernel.script()
    assert "dense_rows" not in text
    assert text.count("T.parallel(") == 1
    vm = relax.VirtualMachine(build(mod, CPU, fuse=False), tvm.cpu())
    for shape in ((1, 1), (1, 9), (2, 7), (3, 16)):
        xs = rng.standard_normal((*shape, 64)).astype("float32")
        got = vm["main"](tvm.runtime.tensor(xs)).numpy()
        np.testing.assert_allclose(got, numpy_activation(xs.astype("float64") @ w + b, "gelu"), rtol=1e-4, atol=1e-4)


def _x_reads_of_the_widest_tile(mod):
    """``(executable, clamped, plain)``: ``mod`` built, and how many reads of ``x`` under the widest unrolled row
    tile of its dense kernels still clamp their row (a ``min`` or ``if_then_else`` in the index) and how many do
    not, in the TIR as LoopPartition leaves it (simplified)."""
    captured = []

    @tvm.instrument.pass_instrument
    class Capture:
        def run_after_pass(self, mod_after, info):
            if info.name == "s_tir.LoopPartition":
                captured.extend(f for gv, f in mod_after.functions.items()
                                if isinstance(f, tvm.tirx.PrimFunc) and "dense" in gv.name_hint)

    with tvm.transform.PassContext(instruments=[Capture()]):
        executable = build(mod, CPU, fuse=False)
    assert captured
    reads = []  # (rows of the enclosing unrolled tile, clamped)
    simplified = tvm.tirx.transform.StmtSimplify()(
        tvm.IRModule({f"k{i}": f for i, f in enumerate(captured)}))
    for _, func in simplified.functions_items():  # no TIR visitor in TVM 0.27's Python API: read the script
        rows = 0
        for line in func.script().splitlines():
            unroll = re.search(r"in T\.unroll\((?:T\.int64\()?(\d+)", line)
            rows = int(unroll.group(1)) if unroll else rows
            for match in re.finditer(r"\bx(?:_\d+)?\[", line):
                depth, end = 1, match.end()
                while depth:
                    depth += {"[": 1, "]": -1}.get(line[end], 0)
                    end += 1
                index = line[match.end():end - 1]
                reads.append((rows, "T.min(" in index or "T.if_then_else(" in index))
    widest = max(rows for rows, _ in reads)
    clamped = [c for rows, c in reads if rows == widest]
    return executable, sum(clamped), len(clamped) - sum(clamped)


@pytest.mark.parametrize("op", ["fused_dense", "fused_gated_dense"])
def test_full_row_tiles_read_x_unclamped(op):
    """Symbolic rows: the padding rows of the last tile read the last real row, but the full tiles read x with no
    clamp (``row_clamp`` "likely", which LoopPartition drops from them). A clamp in every tile gave each of the
    unrolled tile's 8 rows its own pointer, and LLVM reloaded 6 of them from the stack in every step of the K loop
    (1.08-1.14x the static kernel at 16 rows)."""
    from tvm_fusion_ext.ops import params_of

    batch, seq = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")
    rng = np.random.default_rng(6)
    x = relax.Var("x", relax.TensorType((batch, seq, 64), "float32"))
    w = rng.standard_normal((64, 48, 2) if op == "fused_gated_dense" else (64, 48)).astype("float32")
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(call_op(bb, op, {"x": x, "w": relax.const(w)},
                                       {"act": "silu" if op == "fused_gated_dense" else "none"}))
        bb.emit_func_output(y)
    mod = bb.get()
    kernels = [f for _, f in lower(mod, CPU).functions_items() if isinstance(f, tvm.tirx.PrimFunc)
               and params_of(f).get("row_block")]
    assert kernels and all(params_of(f).get("row_clamp") == "likely" for f in kernels)
    executable, clamped, plain = _x_reads_of_the_widest_tile(mod)
    assert clamped and plain, (clamped, plain)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    for shape in ((1, 3), (1, 8), (2, 7), (3, 16)):  # a tail tile, one full tile, both
        xs = rng.standard_normal((*shape, 64)).astype("float32")
        if op == "fused_gated_dense":
            g, u = xs.astype("float64") @ w[..., 0], xs.astype("float64") @ w[..., 1]
            want = g / (1 + np.exp(-g)) * u
        else:
            want = xs.astype("float64") @ w
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(xs)).numpy(), want, rtol=1e-4, atol=1e-4)


def test_knobs_are_typed():
    assert DenseCPU.Knobs.of({"unroll": 2}).unroll == 2
    with pytest.raises(FusionExtError, match="unknown knob 'bogus'.*knobs: i, j, k, mr, unroll"):
        DenseCPU.Knobs.of({"bogus": 1})
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(call_op(bb, "fused_dense", {"x": x, "w": relax.const(np.ones((16, 8), "float32"))},
                                       {"act": "none", "transpose_b": False}))
        bb.emit_func_output(y)
    with pytest.raises(FusionExtError, match="unknown knob"):
        build(bb.get(), CPU, fuse=False, knobs={"tfx.dense": {"bogus": 1}})


def test_fallback_comes_after_the_templates():
    rules = template_rules(CPU) + fallback_rules(CPU)
    assert all(isinstance(r, ScheduleRule) for r in rules)
    assert type(rules[-1]).__name__ == "Fallback"


def test_cpu_dense_packs_constant_weights_only():
    """prepare_operator: a constant weight is pre-packed at compile time, a runtime weight is read in place."""
    def model(weight_is_param):
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((8, 16), "float32"))
        params = [x]
        if weight_is_param:
            w = relax.Var("w", relax.TensorType((16, 32), "float32"))
            params.append(w)
        else:
            w = relax.const(np.ones((16, 32), "float32"))
        with bb.function("main", params):
            with bb.dataflow():
                y = bb.emit_output(call_op(bb, "fused_dense", {"x": x, "w": w}, {"act": "none", "transpose_b": False}))
            bb.emit_func_output(y)
        return bb.get()

    def layouts(mod):
        from tvm_fusion_ext.ops import op_of, params_of

        return [params_of(f).get("w_layout", "plain") for _, f in lower(mod, CPU).functions_items()
                if isinstance(f, tvm.tirx.PrimFunc) and op_of(f) == "fused_dense"]

    assert layouts(model(False)) == ["packed"]
    assert layouts(model(True)) == ["plain"]


def test_kernel_without_root_block_builds():
    """CumSum lowers to a PrimFunc with no root block (RoBERTa's position ids come from CumSum over the mask):
    it used to crash the build with "Cannot find a block with the name: root"."""
    nodes = [helper.make_node("CumSum", ["m", "axis"], ["c"]), helper.make_node("Mul", ["c", "m"], ["pos"])]
    graph = helper.make_graph(nodes, "cumsum", [helper.make_tensor_value_info("m", TensorProto.INT64, [2, 8])],
                              [helper.make_tensor_value_info("pos", TensorProto.INT64, [2, 8])],
                              initializer=[onnx.numpy_helper.from_array(np.array(1, np.int64), "axis")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    mask = np.array([[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 0]], np.int64)
    got = CompiledModel.from_onnx(model).run({"m": mask})["pos"]
    np.testing.assert_array_equal(got, np.cumsum(mask, axis=1) * mask)


@pytest.mark.parametrize("op", ["cosh", "exp"])
def test_fallback_vectorises_only_what_llvm_can_lower_on_vectors(op):
    """LLVM lowers ``cosh``/``sinh`` for scalars only ("unknown intrinsic tirx.cosh" on a vector): the fallback
    still schedules such a kernel (parallel) but leaves its lanes scalar; ``exp`` is vectorised as before."""
    x = te.placeholder((256, 64), "float32", name="x")  # above the serial cut-off
    y = te.compute(x.shape, lambda i, j: getattr(tvm.tirx, op)(x[i, j]), name="y")
    func = te.create_prim_func([x, y])
    target = resolve_target("llvm")
    sch = fallback_rules(target)[-1].apply(func, target, False)
    assert sch is not None
    script = sch.mod["main"].script()
    assert "T.parallel(" in script
    assert ("T.vectorized(" in script) == (op == "exp")
    lib = tvm.compile(sch.mod, target)
    a = np.linspace(-3, 3, 256 * 64, dtype="float32").reshape(256, 64)
    out = tvm.runtime.tensor(np.zeros_like(a))
    lib["main"](tvm.runtime.tensor(a), out)
    np.testing.assert_allclose(out.numpy(), getattr(np, op)(a), rtol=1e-5)


@pytest.mark.parametrize("shape,perm", [
    ((1, 3199, 512), (0, 2, 1)),     # wav2vec2 between convolutions: neither extent has whole 16-lane tiles but 512
    ((1, 320, 512), (0, 2, 1)),      # both have: the vector runs along the write
    ((3, 50, 37), (0, 2, 1)),        # neither: tiles of scalars
    ((2, 24, 40, 33), (0, 3, 1, 2)),  # a 4-D permute whose innermost write axis is read with a stride
])
def test_fallback_tiles_a_transpose_so_each_tile_reads_few_lines(shape, perm):
    """A transpose whose innermost loop reads a new input line per element ran at 1.7 GB/s (wav2vec2's 3199x512):
    the fallback tiles the written and the read-contiguous loops (16 lines per tile)."""
    from tvm_fusion_ext.schedules.cpu.fallback import TRANSPOSE_TILE

    x = te.placeholder(shape, "float32", name="x")
    y = te.compute([shape[p] for p in perm], lambda *i: x[tuple(i[perm.index(d)] for d in range(len(shape)))] * 2.0,
                   name="y")
    target = resolve_target("llvm")
    sch = fallback_rules(target)[-1].apply(te.create_prim_func([x, y]), target, False)
    script = sch.mod["main"].script()
    lanes = TargetInfo.of(target).lanes()
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_sblock("y"))]
    # one parallel loop over tiles, then the tile: two loops of a tile's or a vector's extent (untiled: one
    # fused loop split into vectors)
    assert len(loops) == 3 and loops[0].kind == tvm.tirx.ForKind.PARALLEL, script
    assert {int(lp.extent) for lp in loops[1:]} <= {TRANSPOSE_TILE, lanes}, script
    lib = tvm.compile(sch.mod, target)
    a = np.random.default_rng(0).standard_normal(shape).astype("float32")
    out = tvm.runtime.tensor(np.zeros([shape[p] for p in perm], "float32"))
    lib["main"](tvm.runtime.tensor(a), out)
    np.testing.assert_array_equal(out.numpy(), np.transpose(a, perm) * 2.0)


def test_fallback_tiles_a_transpose_onto_a_symbolic_length():
    """[B, L, C] rows -> [B, C, L] with L known at run time (a dynamic audio export's depthwise taps written back
    channels-first): tiles of 16 positions, the vector along the channels, which the rows hold contiguously."""
    length = tvm.tirx.Var("L", "int64")
    x = te.placeholder((2, length, 64), "float32", name="x")
    y = te.compute((2, 64, length), lambda b, c, i: x[b, i, c] + 1.0, name="y")
    target = resolve_target("llvm")
    sch = fallback_rules(target)[-1].apply(te.create_prim_func([x, y]), target, False)
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_sblock("y"))]
    assert loops[-1].kind == tvm.tirx.ForKind.VECTORIZED and int(loops[-1].extent) == TargetInfo.of(target).lanes()
    lib = tvm.compile(sch.mod, target)
    for n in (37, 5, 64):
        a = np.random.default_rng(n).standard_normal((2, n, 64)).astype("float32")
        out = tvm.runtime.tensor(np.zeros((2, 64, n), "float32"))
        lib["main"](tvm.runtime.tensor(a), out)
        np.testing.assert_array_equal(out.numpy(), np.transpose(a, (0, 2, 1)) + 1.0)


def test_target_info_is_the_one_source_of_target_facts():
    cpu, cuda = TargetInfo.of(CPU), TargetInfo.of(CUDA)
    assert cpu.family == "cpu" and cpu.kind == "llvm" and cpu.lanes("float32") in (8, 16) and cpu.cores >= 1
    assert cuda.family == "cuda" and cuda.lanes("float32") == 4 and cuda.lanes("float16") == 8
    assert cuda.limits() == {"threads": 1024, "smem": 49152, "warp": 32, "registers": 65536}
    assert TargetInfo.of(resolve_target({"kind": "llvm", "mcpu": "skylake-avx512"})).lanes() == 16


@pytest.mark.parametrize("mcpu,mattr,lanes", [
    ("emeraldrapids", None, 16), ("graniterapids", None, 16), ("znver4", None, 16),  # not in any name list
    ("znver3", None, 8), ("x86-64-v3", None, 8),
    ("emeraldrapids", ["-avx512f"], 8),   # AVX-512 switched off
    ("x86-64-v3", ["+avx512f"], 16),
])
def test_vector_width_is_what_llvm_says_the_cpu_has(mcpu, mattr, lanes):
    spec = {"kind": "llvm", "mcpu": mcpu, **({"mattr": mattr} if mattr else {})}
    assert TargetInfo.of(resolve_target(spec)).lanes() == lanes
