"""The build path: target parsing, the shared lowering (weight packing), scheduling, and numerics of the
built executable against numpy and against the plain ``tvm.compile`` of the same module."""

import math
import os
import shutil

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_fusion_ext.compile import build, lower, schedule
from tvm_fusion_ext.deploy.threads import configure_cpu_threads
from tvm_fusion_ext.targets import default_target
from tvm_fusion_ext.targets import resolve_target as as_target
from tvm_fusion_ext.errors import TargetError, TuningLogError
from tvm_fusion_ext.ops.registry import call_op, op_of, params_of

_erf = np.vectorize(math.erf)


def _model(rng, S=64, K=40, N=48, batch=2):
    """fused_dense(gelu, constant weight) -> *2 -> fused_layernorm(+residual) -> softmax -> transpose, plus a
    fused_dense on a runtime (parameter) weight."""
    w = (rng.standard_normal((K, N)) / math.sqrt(K)).astype("float32")
    wt = (rng.standard_normal((N, N)) / math.sqrt(N)).astype("float32")
    b = rng.standard_normal(N).astype("float32")
    g, be = rng.standard_normal(N).astype("float32"), rng.standard_normal(N).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, S, K), "float32"))
    r = relax.Var("r", relax.TensorType((batch, S, N), "float32"))
    w2 = relax.Var("w2", relax.TensorType((N, N), "float32"))
    with bb.function("main", [x, r, w2]):
        with bb.dataflow():
            d = bb.emit(call_op(bb, "fused_dense", {"x": x, "w": relax.const(w), "bias": relax.const(b)},
                                {"act": "gelu"}))
            y = bb.emit(relax.op.multiply(d, relax.const(2.0, "float32")))
            ln = bb.emit(call_op(bb, "fused_layernorm", {"x": y, "residual": r, "gamma": relax.const(g),
                                                         "beta": relax.const(be)}, {"eps": 1e-5}))
            d2 = bb.emit(call_op(bb, "fused_dense", {"x": ln, "w": w2}, {"act": "none", "transpose_b": True}))
            sm = bb.emit(relax.op.nn.softmax(d2, axis=-1))
            t = bb.emit(relax.op.permute_dims(sm, [0, 2, 1]))
            out = bb.emit_output(t)
        bb.emit_func_output(out)

    def reference(xv, rv, w2v):
        z = xv @ w + b
        h = 2 * 0.5 * z * (1 + _erf(z / math.sqrt(2))) + rv
        mu = h.mean(-1, keepdims=True)
        h = (h - mu) / np.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + be
        e = h @ w2v.T
        e = np.exp(e - e.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)).transpose(0, 2, 1)

    return bb.get(), reference


def _run(ex, *args):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def test_build_matches_numpy_and_plain_compile():
    rng = np.random.default_rng(0)
    mod, reference = _model(rng)
    args = [rng.standard_normal(s).astype("float32") for s in ((2, 64, 40), (2, 64, 48), (48, 48))]
    got = _run(build(mod, "llvm", fuse=False), *args)
    np.testing.assert_allclose(got, reference(*[a.astype("float64") for a in args]), rtol=1e-4, atol=1e-5)
    plain = _run(tvm.compile(mod, "llvm"), *args)
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-6)


def test_lower_packs_constant_weights_only():
    mod, _ = _model(np.random.default_rng(1))
    lowered = lower(mod, "llvm")
    dense = {gv.name_hint: params_of(f) for gv, f in lowered.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc) and op_of(f) == "fused_dense"}
    layouts = sorted(p.get("w_layout", "plain") for p in dense.values())
    assert layouts == ["packed", "plain"]  # the constant weight is packed, the parameter is not
    packed = next(p for p in dense.values() if p.get("w_layout") == "packed")
    assert packed["out_features"] == 48 and packed["act"] == "gelu"
    # not a CPU target: nothing to pack
    cuda = lower(mod, "cuda:sm_90")
    assert all(params_of(f).get("w_layout", "plain") == "plain" for f in cuda.functions.values()
               if isinstance(f, tvm.tirx.PrimFunc) and op_of(f) == "fused_dense")


def test_schedule_leaves_no_serial_kernel():
    mod, _ = _model(np.random.default_rng(2))
    scheduled = schedule(lower(mod, "llvm"), "llvm")
    prims = {gv.name_hint: f for gv, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert len(prims) >= 5
    for name, f in prims.items():
        assert f.attrs is not None and bool(f.attrs.get("tirx.is_scheduled", False)), name
        script = f.script()
        assert "T.parallel(" in script, name  # every kernel here is above the fallback's serial cut-off
        if op_of(f) is not None or "transpose" in name or "multiply" in name:
            assert "T.vectorized(" in script, name


def test_build_with_fusion_matches_plain_compile():
    # An unfused graph: SemanticFusion turns matmul+add+gelu into fused_dense; the result must not change.
    rng = np.random.default_rng(3)
    w = rng.standard_normal((32, 64)).astype("float32")
    b = rng.standard_normal(64).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(w)))
            y = bb.emit(relax.op.add(y, relax.const(b)))
            y = bb.emit(relax.op.nn.gelu(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    xv = rng.standard_normal((1, 16, 32)).astype("float32")
    np.testing.assert_allclose(_run(build(mod, "llvm"), xv), _run(tvm.compile(mod, "llvm"), xv),
                               rtol=1e-4, atol=1e-4)


def test_targets():
    t = default_target()
    assert t.kind.name == "llvm" and int(t.attrs["num-cores"]) >= 1
    assert as_target("llvm").kind.name == "llvm"
    assert as_target(t) is t
    assert int(as_target({"kind": "llvm", "num-cores": 3}).attrs["num-cores"]) == 3
    cuda = as_target("cuda:sm_90")
    assert cuda.kind.name == "cuda" and str(cuda.attrs["arch"]) == "sm_90"
    assert int(cuda.attrs["max_shared_memory_per_block"]) > 0 and cuda.host is not None
    assert as_target({"kind": "cuda", "arch": "sm_80"}).host is not None
    for bad in ("cuda -arch=sm_90", "vulkan", "cuda:ampere", "", {"kind": "nonsense"}):
        with pytest.raises(TargetError) as err:
            as_target(bad)
        assert "\n" not in str(err.value)


def test_unfused_matmul_gets_the_dense_template_in_the_fallback():
    # Without SemanticFusion, FuseOps' matmul+add+relu kernel must still be register-blocked, not a serial loop.
    rng = np.random.default_rng(4)
    w = rng.standard_normal((64, 96)).astype("float32")
    b = rng.standard_normal(96).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 40, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(w)))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, relax.const(b))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    scheduled = schedule(lower(mod, "llvm"), "llvm")
    (matmul,) = [f for gv, f in scheduled.functions_items()
                 if isinstance(f, tvm.tirx.PrimFunc) and "matmul" in gv.name_hint]
    script = matmul.script()
    assert "T.parallel(" in script and "T.unroll(" in script and script.count("T.vectorized(") >= 3
    xv = rng.standard_normal((2, 40, 64)).astype("float32")
    got = _run(build(mod, "llvm", fuse=False), xv)
    np.testing.assert_allclose(got, np.maximum(xv @ w + b, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="compile-only CUDA check needs nvcc")
def test_cuda_build_schedules_every_kernel(monkeypatch):
    # No GPU needed: every kernel must be scheduled (thread-bound) or CUDA codegen refuses it.
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", os.environ.get("TVM_CUDA_COMPILE_MODE", "nvcc"))
    mod, _ = _model(np.random.default_rng(5))
    target = as_target("cuda:sm_90")
    scheduled = schedule(lower(mod, target), target)
    for gv, f in scheduled.functions_items():
        if isinstance(f, tvm.tirx.PrimFunc):
            assert bool(f.attrs.get("tirx.is_scheduled", False)), gv.name_hint
    assert build(mod, target, fuse=False) is not None


def test_missing_tuning_logs_are_a_one_line_error(tmp_path):
    mod, _ = _model(np.random.default_rng(6))
    with pytest.raises(TuningLogError):
        build(mod, "llvm", logs=str(tmp_path / "nowhere"), fuse=False)


def test_cpu_thread_pool_uses_every_core():
    # TVM alone would give a 2-vCPU machine a 1-thread pool (it halves logical CPUs), serialising T.parallel.
    usable = len(os.sched_getaffinity(0))
    assert configure_cpu_threads() == usable
    assert int(tvm.get_global_func("runtime.NumThreads")()) == usable
    assert os.environ["TVM_NUM_THREADS"].isdigit()


@pytest.mark.parametrize("given,want", [(None, "1000"), ("0", "0"), ("300000", "300000")])
def test_idle_workers_yield_briefly_unless_the_environment_says_otherwise(given, want, monkeypatch):
    # TVM reads the count once, when its pool's first worker starts: what is checked is what the pool would read
    monkeypatch.setenv("TVM_THREAD_POOL_SPIN_COUNT", "")  # recorded, so that the test's own setting is undone
    monkeypatch.delenv("TVM_THREAD_POOL_SPIN_COUNT")
    if given is not None:
        monkeypatch.setenv("TVM_THREAD_POOL_SPIN_COUNT", given)
    configure_cpu_threads()
    assert os.environ["TVM_THREAD_POOL_SPIN_COUNT"] == want


def _attention_model(dtype, S, D=32, heads=2):
    shape = (1, S, heads, D)
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(n, relax.TensorType(shape, dtype)) for n in "qkv")
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(call_op(bb, "fused_attention", {"q": q, "k": k, "v": v},
                                                 {"scale": D ** -0.5})))
        bb.emit_func_output(out)
    return bb.get()


def _key_blocks(mod):
    return [params_of(f)["key_block"] if "key_block" in params_of(f) else None
            for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc) and op_of(f) == "fused_attention"]


@pytest.mark.parametrize("dtype,S,target,want", [
    ("float16", 256, "cuda:sm_80", [64]),    # tensor-core tiles: 64 keys per block
    ("bfloat16", 128, "cuda:sm_90", [64]),
    ("float16", 32, "cuda:sm_80", [None]),   # fewer keys than a block: the operator's own choice (32)
    ("float32", 256, "cuda:sm_80", [None]),  # SIMT template: unchanged
    ("float16", 256, "llvm", [None]),        # CPU: unchanged
])
def test_cuda_16bit_attention_gets_tensor_core_key_blocks(dtype, S, target, want):
    assert _key_blocks(lower(_attention_model(dtype, S), as_target(target))) == want


def test_a_reshape_tvm_cannot_view_stays_a_copy():
    # Pegasus-X's dynamic export: [B, seq + 4, 16] -> [B, (seq + 4) · 4, 4]. TVM's RewriteDataflowReshape asserted
    # on it ("the padding factor ... is not divisible"), a crash at build time; the reshape now stays a copy kernel
    seq = tvm.tirx.Var("seq", "int64")
    x = relax.Var("x", relax.TensorType((2, seq + 4, 16), "float32"))
    ids = relax.Var("ids", relax.TensorType((seq,), "float32"))  # binds seq when the module runs
    bb = relax.BlockBuilder()
    with bb.function("main", [x, ids]):
        with bb.dataflow():
            y = bb.emit(relax.op.reshape(x, (2, (seq + 4) * 4, 4)))
            out = bb.emit_output(bb.emit(relax.op.add(y, y)))
        bb.emit_func_output(out)
    xv = np.random.default_rng(1).standard_normal((2, 7, 16)).astype("float32")
    got = _run(build(bb.get(), "llvm", fuse=False), xv, np.zeros(3, "float32"))
    np.testing.assert_array_equal(got, 2 * xv.reshape(2, 28, 4))


def test_target_facts_come_from_target_info():
    """Cache sizes, vector registers and CUDA's per-thread registers are TargetInfo's, for every reader."""
    from tvm_fusion_ext.targets import TargetInfo, host_caches, resolved_target

    cpu = TargetInfo.of(default_target())
    assert (cpu.l1_bytes, cpu.l2_bytes, cpu.l3_bytes) == host_caches() and cpu.l1_bytes > 0 and cpu.l2_bytes > 0
    avx512 = "avx512f" in open("/proc/cpuinfo").read()
    assert cpu.vector_registers == (32 if avx512 else 16)
    assert cpu.vector_register_bytes == cpu.vector_registers * cpu.vector_bits // 8
    assert TargetInfo.of(as_target("llvm:x86-64-v4")).vector_register_bytes == 32 * 64  # AVX-512: 32 zmm
    cuda = TargetInfo.of(as_target("cuda:sm_90"))
    assert cuda.max_registers_per_thread == 255 and cuda.l1_bytes == 0 and cuda.vector_registers == 0
    # a resolved target passes through the compile steps as it is; a spec is resolved
    t = default_target()
    assert resolved_target(t) is t and resolved_target("llvm").kind.name == "llvm"


def test_record_directory_names_unchanged():
    """Record directories are named from TargetInfo's kind and arch: the shipped ``tuning_logs`` names."""
    from tvm_fusion_ext.records import target_label

    assert target_label(as_target("llvm:x86-64-v3")) == "llvm-x86-64-v3"
    assert target_label(as_target("cuda:sm_90")) == "cuda-sm_90"
    assert target_label(tvm.target.Target({"kind": "llvm"})) == "llvm"


def test_compile_model_builds_its_template_rules_once(monkeypatch):
    """One list of template rules serves the lowering (operator parameters) and the scheduling (and every
    run-time variant), so knobs are validated and applied once per compilation."""
    from tvm_fusion_ext.compile import compile_model
    from tvm_fusion_ext.schedules import registry

    calls = []
    real = registry.template_rules

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(registry, "template_rules", counting)
    mod, reference = _model(np.random.default_rng(0), S=8, K=16, N=16, batch=1)
    compiled = compile_model(mod, default_target(), fuse_graph=False)
    assert len(calls) == 1
    rng = np.random.default_rng(1)
    x, r, w2 = (rng.standard_normal(s).astype("float32") for s in ((1, 8, 16), (1, 8, 16), (16, 16)))
    np.testing.assert_allclose(_run(compiled.executable, x, r, w2), reference(x, r, w2), rtol=1e-4, atol=1e-4)
