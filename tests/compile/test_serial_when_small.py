"""A parallel loop of run-time extent runs serial when the call is small (compile/serial_when_small.py): the
guard is placed on symbolic kernels only, and both branches compute what numpy does."""

import numpy as np
import tvm
from tvm import relax, tirx

from tvm_fusion_ext.compile.pipeline import compile_model, prepare
from tvm_fusion_ext.compile.schedule import schedule
from tvm_fusion_ext.compile.codegen.serial_when_small import MIN_PARALLEL_WORK, SerialWhenSmall
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.testing import build_module
from tvm_fusion_ext.tir_nodes import collect

TARGET = resolve_target({"kind": "llvm", "num-cores": 2})


def _add_module(rows):
    x = relax.Var("x", relax.TensorType([rows, 1024], "float32"))
    y = relax.Var("y", relax.TensorType([rows, 1024], "float32"))
    return build_module([x, y], lambda bb: relax.op.add(x, y))


def _guarded(mod):
    scheduled = SerialWhenSmall()(schedule(prepare(mod, TARGET, fuse_graph=False)[0], TARGET))
    return [f for _, f in scheduled.functions_items()
            if isinstance(f, tirx.PrimFunc) and f.attrs is not None and "tfx.serial_when_small" in f.attrs]


def test_a_symbolic_kernel_gets_a_serial_branch_for_small_calls():
    guarded = _guarded(_add_module(tirx.Var("n", "int64")))
    assert len(guarded) == 1
    loops = collect(guarded[0].body, tirx.For)
    kinds = {int(lp.kind) for lp in loops}
    assert int(tirx.ForKind.PARALLEL) in kinds and int(tirx.ForKind.SERIAL) in kinds
    assert f"T.int64({MIN_PARALLEL_WORK})" in guarded[0].script()
    assert _guarded(_add_module(64)) == []  # a static kernel keeps what its schedule chose


def test_both_branches_match_numpy(monkeypatch):
    monkeypatch.setenv("TFX_SERIAL_WHEN_SMALL", "1")
    compiled = compile_model(_add_module(tirx.Var("n", "int64")), TARGET, fuse_graph=False)
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    rng = np.random.default_rng(0)
    for rows in (1, 3, 64):  # 1024 and 3072 elements: serial; 65536: parallel
        x, y = (rng.standard_normal((rows, 1024)).astype("float32") for _ in range(2))
        got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y)).numpy()
        np.testing.assert_array_equal(got, x + y)


def test_by_default_the_fallback_and_row_wise_kernels_are_guarded(monkeypatch):
    """Without the flag a build guards the fallback's kernels (a residual add) and the row-wise templates' (RMSNorm);
    a template left out of the rules keeps its parallel loop; ``TFX_SERIAL_WHEN_SMALL=1`` guards every kernel,
    ``=0`` none."""
    from tvm_fusion_ext.compile.codegen.serial_when_small import ROW_RULES, serial_when_small_rules

    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([n, 1024], "float32"))
    y = relax.Var("y", relax.TensorType([n, 1024], "float32"))
    w = relax.const(np.ones(1024, "float32"))
    mod = build_module([x, y], lambda bb: relax.op.add(bb.emit(relax.op.nn.rms_norm(x, w, axes=[-1])), y))
    scheduled = schedule(prepare(mod, TARGET)[0], TARGET)

    def guarded(rules):
        out = SerialWhenSmall(rules)(scheduled)
        return sorted(gv.name_hint for gv, f in out.functions_items()
                      if isinstance(f, tirx.PrimFunc) and "tfx.serial_when_small" in (f.attrs or {}))

    monkeypatch.delenv("TFX_SERIAL_WHEN_SMALL", raising=False)
    assert serial_when_small_rules() == ROW_RULES
    assert len(guarded(ROW_RULES)) == 2 and len(guarded(None)) == 2
    without_rmsnorm = guarded(("tfx.layernorm",))
    assert len(without_rmsnorm) == 1 and "rms" not in without_rmsnorm[0]
    monkeypatch.setenv("TFX_SERIAL_WHEN_SMALL", "0")
    assert serial_when_small_rules() == ()
    monkeypatch.setenv("TFX_SERIAL_WHEN_SMALL", "1")
    assert serial_when_small_rules() is None


def test_a_rotary_embedding_no_template_takes_is_guarded_and_matches_numpy():
    """The fallback schedules our rotary embedding (no CPU template): a decode step's one token per sequence
    rotates 1024 values, so its kernel is guarded like the other fallback kernels."""
    from tvm_fusion_ext.ops import call_op

    seq = tirx.Var("seq", "int64")
    x = relax.Var("x", relax.TensorType([1, 4, seq, 64], "float32"))
    cos = relax.Var("cos", relax.TensorType([1, seq, 64], "float32"))
    sin = relax.Var("sin", relax.TensorType([1, seq, 64], "float32"))
    mod = build_module([x, cos, sin], lambda bb: call_op(bb, "fused_rope", {"x": x, "cos": cos, "sin": sin},
                                                          {"style": "half"}))
    from tvm_fusion_ext.compile.codegen.serial_when_small import ROW_RULES

    guarded = SerialWhenSmall(ROW_RULES)(schedule(prepare(mod, TARGET, fuse_graph=False)[0], TARGET))
    assert [str(f.attrs["tfx.op"]) for _, f in guarded.functions_items()
            if isinstance(f, tirx.PrimFunc) and "tfx.serial_when_small" in (f.attrs or {})] == ["fused_rope"]

    vm = relax.VirtualMachine(compile_model(mod, TARGET, fuse_graph=False).executable, tvm.cpu())
    rng = np.random.default_rng(1)
    for length in (1, 300):  # 256 values: serial; 76800: parallel
        a = rng.standard_normal((1, 4, length, 64)).astype("float32")
        c, s = (rng.standard_normal((1, length, 64)).astype("float32") for _ in range(2))
        rotated_half = np.concatenate([-a[..., 32:], a[..., :32]], axis=-1)
        got = vm["main"](*(tvm.runtime.tensor(t) for t in (a, c, s))).numpy()
        np.testing.assert_allclose(got, a * c[:, None] + rotated_half * s[:, None], rtol=1e-5, atol=1e-5)
