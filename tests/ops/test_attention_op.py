"""fused_attention on CPU: compute + template against numpy over shapes, layouts, masks, causal and knobs;
plus the flash property (no S×T workspace) checked on the lowered TIR."""

import re

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, tirx

from tvm_fusion_ext.ops.attention import default_key_block
from tvm_fusion_ext.ops.registry import make_prim_func
from tvm_fusion_ext.schedules.cpu.attention import AttentionCPU, QUERY_TILES, ROW_STEPS, UNROLL, attention_cpu
from tvm_fusion_ext.schedules.registry import get_template

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def _to_bhsd(x, layout):
    return x if layout == "BHSD" else x.transpose(0, 2, 1, 3)


def _from_bhsd(x, layout):
    return x if layout == "BHSD" else x.transpose(0, 2, 1, 3)


def _reference(q, k, v, mask, scale, causal, layouts, softcap=0.0):
    """softmax in float64 over scores rounded like the kernel's (fp32 scale·qkᵀ, capped, + mask); empty rows → 0."""
    ql, kl, vl, ol = layouts
    q, k, v = (_to_bhsd(x, lay).astype("float64") for x, lay in ((q, ql), (k, kl), (v, vl)))
    S, T = q.shape[2], k.shape[2]
    s = (q @ k.transpose(0, 1, 3, 2)).astype("float32") * np.float32(scale)
    if softcap:
        s = (softcap * np.tanh(s.astype("float64") / softcap)).astype("float32")
    if mask is not None:
        s = s + mask.astype("float32")
    s = s.astype("float64")
    if causal:
        i, j = np.arange(S)[:, None], np.arange(T)[None, :]
        s = np.where(j <= i + T - S, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    empty = np.isneginf(m)
    p = np.where(np.isneginf(s), 0.0, np.exp(s - np.where(empty, 0.0, m)))
    den = p.sum(axis=-1, keepdims=True)
    out = np.where(den > 0, (p @ v) / np.where(den > 0, den, 1.0), 0.0)
    return _from_bhsd(out, ol)


def _shape(layout, B, H, S, D):
    return (B, H, S, D) if layout == "BHSD" else (B, S, H, D)


def _func(arrays, params):
    ty = lambda a: relax.TensorType(list(a.shape), str(a.dtype))  # noqa: E731
    f = make_prim_func("fused_attention", {n: ty(a) for n, a in arrays.items() if a is not None}, params)
    return f.with_attr("global_symbol", "main")


def _schedule(func, knobs=None):
    sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
    attention_cpu(sch, sch.get_sblock("attn_out"), TARGET, knobs)
    return sch.mod


def _run(B, H, S, T, D, layouts=("BSHD",) * 4, mask_shape=None, causal=False, mask=None, knobs=None,
         scheduled=True, dtype="float32", key_block=None, seed=0, DV=None, softcap=0.0, spread=1.0):
    rng = np.random.default_rng(seed)
    ql, kl, vl, ol = layouts
    DV = DV or D
    q = (spread * rng.standard_normal(_shape(ql, B, H, S, D))).astype(dtype)
    k = rng.standard_normal(_shape(kl, B, H, T, D)).astype(dtype)
    v = rng.standard_normal(_shape(vl, B, H, T, DV)).astype(dtype)
    if mask is None and mask_shape is not None:
        mask = rng.standard_normal(mask_shape).astype("float32")
    scale = 1.0 / np.sqrt(D)
    params = {"scale": float(scale), "causal": causal, "q_layout": ql, "k_layout": kl, "v_layout": vl,
              "out_layout": ol}
    if key_block is not None:
        params["key_block"] = key_block
    if softcap:
        params["softcap"] = softcap
    func = _func({"q": q, "k": k, "v": v, "mask": mask}, params)
    mod = _schedule(func, knobs) if scheduled else tvm.IRModule({"main": func})
    lib = tvm.compile(mod, target=TARGET)
    dev = tvm.cpu()
    out = tvm.runtime.empty(_shape(ol, B, H, S, DV), dtype, dev)
    lib(*[tvm.runtime.tensor(a, dev) for a in (q, k, v, mask) if a is not None], out)
    return out.numpy(), _reference(q, k, v, mask, scale, causal, layouts, softcap)


def _close(got, want, tol=2e-5):
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_template_is_registered():
    assert isinstance(get_template("tfx.attention", TARGET), AttentionCPU)


@pytest.mark.parametrize("B,H,S,T,D,layouts", [
    (1, 2, 1, 1, 32, ("BSHD", "BSHD", "BSHD", "BSHD")),
    (2, 3, 5, 7, 64, ("BHSD", "BSHD", "BHSD", "BSHD")),
    (1, 2, 33, 70, 64, ("BSHD", "BSHD", "BSHD", "BHSD")),
    (1, 1, 17, 17, 128, ("BHSD", "BHSD", "BHSD", "BHSD")),
    (2, 2, 1, 65, 32, ("BSHD", "BHSD", "BSHD", "BSHD")),
    (1, 2, 70, 33, 64, ("BHSD", "BHSD", "BSHD", "BHSD")),
    (1, 3, 40, 129, 48, ("BSHD", "BSHD", "BSHD", "BSHD")),
])
def test_shapes_and_layouts(B, H, S, T, D, layouts):
    _close(*_run(B, H, S, T, D, layouts))


@pytest.mark.parametrize("B,H,S,T,D,DV,layouts,causal", [
    (2, 3, 9, 13, 24, 16, ("BSHD",) * 4, False),                      # MLA: q/k 24 (nope 16 + rope 8), v 16
    (1, 2, 33, 70, 48, 32, ("BHSD", "BSHD", "BHSD", "BSHD"), True),
    (2, 2, 16, 16, 8, 32, ("BHSD",) * 4, False),                      # LeViT: v 4x the q/k head dim
])
def test_value_head_dim_differs(B, H, S, T, D, DV, layouts, causal):
    got, want = _run(B, H, S, T, D, layouts, causal=causal, DV=DV)
    assert got.shape == _shape(layouts[3], B, H, S, DV)
    _close(got, want)


@pytest.mark.parametrize("mask_shape,causal", [
    ((13,), False),
    ((1, 1, 1, 13), False),
    ((2, 1, 9, 13), False),
    ((2, 2, 9, 13), False),
    ((9, 13), False),
    (None, True),
    ((2, 1, 9, 13), True),
])
def test_masks_and_causal(mask_shape, causal):
    _close(*_run(2, 2, 9, 13, 32, ("BSHD", "BHSD", "BHSD", "BSHD"), mask_shape=mask_shape, causal=causal))


@pytest.mark.parametrize("mask_shape,causal,scheduled", [
    (None, False, True), ((2, 1, 9, 13), True, True), ((1, 1, 1, 13), False, False)])
def test_soft_capped_scores(mask_shape, causal, scheduled):
    # q scaled up: most scores lie past the cap, where tanh bends (uncapped attention is far from this)
    got, want = _run(2, 2, 9, 13, 32, ("BSHD", "BHSD", "BHSD", "BSHD"), mask_shape=mask_shape, causal=causal,
                     scheduled=scheduled, softcap=1.5, spread=4.0)
    _close(got, want)
    _, plain = _run(2, 2, 9, 13, 32, ("BSHD", "BHSD", "BHSD", "BSHD"), mask_shape=mask_shape, causal=causal,
                    scheduled=scheduled, spread=4.0)
    assert np.abs(got - plain).max() > 1e-2


@pytest.mark.parametrize("S,T", [(5, 12), (12, 5), (1, 9), (70, 70)])
def test_causal_offsets(S, T):
    # T < S leaves the first S - T rows without a visible key: they must be 0, not NaN
    got, want = _run(1, 2, S, T, 32, causal=True)
    _close(got, want)
    if T < S:
        assert not got[:, : S - T].any()


def test_fully_masked_rows_are_zero():
    B, H, S, T = 1, 2, 6, 20
    mask = np.zeros((B, 1, S, T), "float32")
    mask[:, :, 2, :] = -np.inf  # a whole row
    mask[:, :, 4, :17] = -np.inf  # all but the last 3 keys
    mask[:, :, 5, ::2] = -np.inf
    got, want = _run(B, H, S, T, 32, mask=mask)
    _close(got, want)
    assert not got[:, 2].any()


@pytest.mark.parametrize("big", [-3.4028234663852886e38, -10000.0])
def test_big_negative_finite_masks(big):
    # finite big negatives are ordinary scores: a row masked everywhere is a plain average, never NaN/inf
    B, H, S, T = 1, 2, 5, 70
    mask = np.zeros((B, 1, S, T), "float32")
    mask[..., 1, :] = big
    mask[..., 3, 10:] = big
    mask[..., 4, :64] = big  # a whole key block masked, the next block not
    got, want = _run(B, H, S, T, 32, mask=mask, causal=True)
    _close(got, want, tol=1e-4 if big == -10000.0 else 2e-5)


@pytest.mark.parametrize("B,H,S,T,D,mask_shape,causal", [
    (1, 2, 3, 5, 16, None, False),
    (2, 1, 7, 4, 8, (2, 1, 7, 4), True),
])
def test_unscheduled_build(B, H, S, T, D, mask_shape, causal):
    _close(*_run(B, H, S, T, D, mask_shape=mask_shape, causal=causal, scheduled=False))


@pytest.mark.parametrize("knobs", [  # key block 128 (T = 100), head dim 64
    {"query_tile": QUERY_TILES.index(8), "qk_rows": ROW_STEPS.index(2), "qk_vec": [16, 8], "pv_rows": 0,
     "pv_vec": [8, 8], "p_vec": [8, 16], "unroll": UNROLL.index(0)},
    {"query_tile": QUERY_TILES.index(1), "qk_rows": ROW_STEPS.index(4), "qk_vec": [2, 64], "pv_rows": 2,
     "pv_vec": [2, 32], "p_vec": [128, 1], "out_vec": [4, 16], "online_vec": [64, 1], "unroll": 1},
    {"query_tile": QUERY_TILES.index(64), "unroll": UNROLL.index(8)},
])
def test_explicit_knobs(knobs):
    _close(*_run(1, 2, 37, 100, 64, mask_shape=(37, 100), causal=True, knobs=knobs))


@pytest.mark.parametrize("key_block", [8, 32])
def test_key_block_parameter(key_block):
    _close(*_run(1, 2, 11, 50, 32, mask_shape=(50,), key_block=key_block))


def test_float16_io():
    got, want = _run(1, 2, 9, 20, 32, layouts=("BHSD",) * 4, dtype="float16", causal=True)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype("float32"), want, rtol=2e-3, atol=2e-3)


def test_default_key_block():
    assert [default_key_block(t) for t in (1, 8, 9, 33, 64, 65, 4096)] == [8, 8, 16, 64, 64, 128, 128]


# -- the flash property ---------------------------------------------------------------------------------------

def _lowered_allocations(mod):
    """(name, elements) of every buffer the lowered TIR allocates (parameters are not allocations)."""
    passes = [s_tir.transform.LowerInitBlock(), s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
              s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.CompactBufferAllocation(),
              s_tir.transform.LowerOpaqueBlock(), tirx.transform.FlattenBuffer(),
              tirx.transform.VectorizeLoop(True)]
    text = tvm.ir.transform.Sequential(passes)(mod)["main"].script()
    allocs = []
    for name, shape, dtype in re.findall(r"(\w+) = T\.alloc_buffer\(\(([^)]*)\),?\s*(?:\"(\w+)\")?", text):
        lanes = int(dtype.split("x")[1]) if "x" in dtype else 1
        allocs.append((name, int(np.prod([int(x) for x in shape.split(",") if x.strip()])) * lanes))
    return allocs


def _flash_mod(S, T, H=2, D=64, causal=True):
    q = np.zeros((1, S, H, D), "float32")
    kv = np.zeros((1, T, H, D), "float32")
    params = {"scale": 0.125, "causal": causal, "q_layout": "BSHD", "k_layout": "BSHD", "v_layout": "BSHD",
              "out_layout": "BSHD"}
    return _schedule(_func({"q": q, "k": kv, "v": kv, "mask": np.zeros((1, 1, S, T), "float32")}, params))


@pytest.mark.parametrize("S", [512, 2048])
def test_no_score_matrix_in_lowered_tir(S):
    H, D = 2, 64
    allocs = _lowered_allocations(_flash_mod(S, S, H, D))
    assert allocs, "expected the per-tile working buffers to show up as allocations"
    kv_size = H * S * D
    names = {n for n, _ in allocs}
    assert {"attn_qk", "attn_bo", "attn_online_v2"} <= names
    for name, size in allocs:
        assert size < S * S, f"{name} has {size} elements: an S×T buffer"
        # the only sequence-sized buffer is K transposed (K's own size); the rest are per query tile
        assert size <= kv_size if name == "attn_kt" else size <= 64 * 64 * 2, (name, size)


def test_workspace_grows_linearly():
    small = sum(n for _, n in _lowered_allocations(_flash_mod(256, 256)))
    large = sum(n for _, n in _lowered_allocations(_flash_mod(1024, 1024)))
    assert large <= 4.2 * small  # 4x the sequence: 4x the K copy, the per-tile buffers stay; S×T would be 16x


def test_key_copy_reads_whole_rows_of_k():
    """The key-block copy of K walks the keys and reads each key's head dims as one vector. Vectorised over the
    keys it gathered 16 clamped elements a row apart per vector, which LLVM scalarises."""
    sch = s_tir.Schedule(_flash_mod(96, 96, H=2, D=64, causal=False))
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_sblock("attn_kt"))]
    assert loops[-1].kind == tvm.tirx.ForKind.VECTORIZED
    assert int(loops[-1].extent) == 64  # the head dim ...
    assert int(loops[-2].extent) == 128  # ... under the keys of a block (96 keys: one 128-key block)


def test_knob_that_does_not_tile_is_rejected():
    q = np.zeros((1, 8, 2, 64), "float32")
    params = {"scale": 1.0, "causal": False, "q_layout": "BSHD", "k_layout": "BSHD", "v_layout": "BSHD",
              "out_layout": "BSHD"}
    with pytest.raises(ValueError, match="pv_vec"):
        _schedule(_func({"q": q, "k": q, "v": q}, params), {"pv_vec": [3, 16]})


def test_trace_replays_with_other_decisions():
    # MetaSchedule mutates the recorded samples and replays the trace: the template must not depend on them
    B, H, S, T, D = 1, 2, 21, 40, 32
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((B, n, H, D)).astype("float32") for n in (S, T, T))
    params = {"scale": 0.2, "causal": True, "q_layout": "BSHD", "k_layout": "BSHD", "v_layout": "BSHD",
              "out_layout": "BSHD"}
    func = _func({"q": q, "k": k, "v": v}, params)
    sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
    attention_cpu(sch, sch.get_sblock("attn_out"), TARGET)
    trace = sch.trace
    cats = [inst for inst in trace.insts if inst.kind.name == "SampleCategorical"]
    assert len(cats) == 4  # query_tile, qk_rows, pv_rows, unroll
    for inst, decision in zip(cats, (2, 0, 1, 2)):
        trace = trace.with_decision(inst, decision, remove_postproc=True)
    replay = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
    trace.apply_to_schedule(replay, remove_postproc=True)
    assert replay.mod.script() != sch.mod.script()
    lib = tvm.compile(replay.mod, target=TARGET)
    out = tvm.runtime.empty((B, S, H, D), "float32")
    lib(*[tvm.runtime.tensor(a) for a in (q, k, v)], out)
    _close(out.numpy(), _reference(q, k, v, None, 0.2, True, ("BSHD",) * 4))


@pytest.mark.parametrize("mask,params", [
    (np.zeros((3, 13), "float32"), {}),  # S is 9
    (np.zeros((13,), "bool"), {}),
    (None, {"key_block": 24}),
    (None, {"q_layout": "SBHD"}),
])
def test_rejects_bad_arguments(mask, params):
    arrays = {"q": np.zeros((1, 9, 2, 16), "float32"), "k": np.zeros((1, 13, 2, 16), "float32"),
              "v": np.zeros((1, 13, 2, 16), "float32"), "mask": mask}
    base = {"scale": 1.0, "causal": False, "q_layout": "BSHD", "k_layout": "BSHD", "v_layout": "BSHD",
            "out_layout": "BSHD"}
    with pytest.raises(ValueError):
        _func(arrays, {**base, **params})


# -- CUDA (SIMT) template ---------------------------------------------------------------------------------------

def _cuda_target(arch):
    return tvm.target.Target({"kind": "cuda", "arch": arch, "max_shared_memory_per_block": 49152,
                              "max_num_threads": 1024, "thread_warp_size": 32}, host="llvm")


def _cuda_build(B, H, S, T, D, arch, mask_shape=None, causal=True, layouts=("BSHD",) * 4, DV=None,
                dtype="float32"):
    from tvm_fusion_ext.schedules.cuda.attention import attention_cuda

    ql, kl, vl, ol = layouts
    arrays = {"q": np.zeros(_shape(ql, B, H, S, D), dtype), "k": np.zeros(_shape(kl, B, H, T, D), dtype),
              "v": np.zeros(_shape(vl, B, H, T, DV or D), dtype),
              "mask": None if mask_shape is None else np.zeros(mask_shape, "float32")}
    params = {"scale": 1.0 / np.sqrt(D), "causal": causal, "q_layout": ql, "k_layout": kl, "v_layout": vl,
              "out_layout": ol}
    target = _cuda_target(arch)
    sch = s_tir.Schedule(tvm.IRModule({"main": _func(arrays, params)}), seed=1)
    attention_cuda(sch, sch.get_sblock("attn_out"), target)
    return tvm.compile(sch.mod, target=target)


def _cuda_source(ex):
    todo, found = [ex.mod], []
    while todo:
        m = todo.pop()
        found += [m] if m.kind == "cuda" else []
        todo += list(m.imports)
    return found[0].inspect_source()


def _ptxas_frames(src: str, arch: str, tmp_path):
    """``([(stack, spill stores, spill loads)] per kernel, the ptxas log)`` of CUDA source compiled by nvcc."""
    import subprocess

    cu = tmp_path / "k.cu"
    cu.write_text(src)
    res = subprocess.run(["nvcc", "--cubin", f"-arch={arch}", "-O3", "-w", "-Xptxas", "-v", "-o",
                          str(tmp_path / "k.cubin"), str(cu)], capture_output=True, text=True, check=True)
    log = res.stdout + res.stderr
    return re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log), log


@pytest.mark.parametrize("arch,shape,mask_shape,extra", [
    ("sm_80", (2, 3, 37, 129, 128), (2, 1, 37, 129), {}),
    ("sm_90", (1, 2, 33, 70, 64), (70,), {}),
    ("sm_90", (1, 2, 16, 5, 48), None, {}),
    ("sm_90", (1, 2, 64, 64, 48), None, {"DV": 32}),                       # MLA-like: v's own head dim
    ("sm_90", (1, 2, 64, 64, 48), None, {"DV": 32, "dtype": "float16"}),  # 16-bit: SIMT, not tensor cores
])
def test_cuda_template_compiles_without_spills(arch, shape, mask_shape, extra, tmp_path, monkeypatch):
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")
    src = _cuda_source(_cuda_build(*shape, arch, mask_shape=mask_shape, **extra))
    frames, log = _ptxas_frames(src, arch, tmp_path)
    assert len(frames) == 2  # K transpose + the attention kernel
    assert all(f == ("0", "0", "0") for f in frames), log
    assert "__syncthreads" in src and "__shared__" in src
    if "DV" in extra:  # the tensor-core tiles are sized for one head dim
        assert "mma" not in src


@pytest.mark.gpu
@pytest.mark.skipif(not tvm.cuda(0).exist, reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("shape,mask_shape,causal", [((2, 3, 37, 129, 64), (2, 1, 37, 129), True),
                                                     ((1, 2, 16, 5, 48), None, False),
                                                     ((1, 12, 128, 128, 64), None, False)])
def test_cuda_numerics(shape, mask_shape, causal):
    B, H, S, T, D = shape
    ex = _cuda_build(*shape, "sm_" + "".join(tvm.cuda(0).compute_version.split(".")), mask_shape=mask_shape,
                     causal=causal)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, n, H, D)).astype("float32") for n in (S, T, T))
    mask = None if mask_shape is None else rng.standard_normal(mask_shape).astype("float32")
    dev = tvm.cuda(0)
    out = tvm.runtime.empty((B, S, H, D), "float32", dev)
    ex(*[tvm.runtime.tensor(a, dev) for a in (q, k, v, mask) if a is not None], out)
    _close(out.numpy(), _reference(q, k, v, mask, 1.0 / np.sqrt(D), causal, ("BSHD",) * 4), tol=1e-4)


# -- head ranges: Q, K and V read from one tensor (a fused QKV projection's output) ----------------------------

def _head_range_case(B, S, H, HKV, D, lead, causal, seed=0):
    """X [B, S, lead + H + 2·HKV, D] passed as q, k and v, and the reference on its slices (K/V heads repeated)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, S, lead + H + 2 * HKV, D)).astype("float32")
    starts = {"q": lead, "k": lead + H, "v": lead + H + HKV}
    params = {"scale": 0.3, "causal": causal, "q_layout": "BSHD", "k_layout": "BSHD", "v_layout": "BSHD",
              "out_layout": "BSHD", "heads": H, "kv_heads": HKV, **{f"{n}_head_start": s for n, s in starts.items()}}
    q = x[:, :, lead:lead + H]
    k, v = (np.repeat(x[:, :, starts[n]:starts[n] + HKV], H // HKV, axis=2) for n in ("k", "v"))
    return x, params, _reference(q, k, v, None, 0.3, causal, ("BSHD",) * 4)


@pytest.mark.parametrize("B,S,H,HKV,D,lead,causal,scheduled", [
    (2, 9, 3, 3, 16, 0, False, True),     # MHA: [q | k | v]
    (1, 37, 4, 1, 32, 0, True, True),     # multi-query, causal
    (2, 20, 4, 2, 8, 2, False, True),     # GQA behind two heads of something else
    (1, 5, 2, 2, 16, 1, True, False),     # the unscheduled compute
])
def test_head_ranges_of_one_tensor(B, S, H, HKV, D, lead, causal, scheduled):
    x, params, want = _head_range_case(B, S, H, HKV, D, lead, causal)
    func = _func({"q": x, "k": x, "v": x}, params)
    mod = _schedule(func) if scheduled else tvm.IRModule({"main": func})
    out = tvm.runtime.empty((B, S, H, D), "float32")
    tx = tvm.runtime.tensor(x)
    tvm.compile(mod, target=TARGET)(tx, tx, tx, out)
    _close(out.numpy(), want)


@pytest.mark.parametrize("params,message", [
    ({"heads": 4, "kv_heads": 2, "q_head_start": 0, "k_head_start": 4, "v_head_start": 7}, r"v heads \[7, 9\)"),
    ({"heads": 3, "kv_heads": 2, "k_head_start": 3, "v_head_start": 5}, "divide"),
    ({"heads": 2, "q_head_start": -1}, r"q heads \[-1, 1\)"),
])
def test_head_ranges_outside_the_operand_are_refused(params, message):
    x = np.zeros((1, 4, 8, 16), "float32")
    base = {"scale": 1.0, "causal": False, "q_layout": "BSHD", "k_layout": "BSHD", "v_layout": "BSHD",
            "out_layout": "BSHD"}
    with pytest.raises(ValueError, match=message):
        _func({"q": x, "k": x, "v": x}, {**base, **params})


@pytest.mark.parametrize("arch,dtype", [("sm_90", "float32"), ("sm_80", "float16")])
def test_cuda_head_ranges_compile_without_spills(arch, dtype, tmp_path, monkeypatch):
    import shutil

    from tvm_fusion_ext.schedules.cuda.attention import attention_cuda

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")
    x, params, _ = _head_range_case(1, 64, 4, 2, 64, 0, True)
    x = x.astype(dtype)
    target = _cuda_target(arch)
    sch = s_tir.Schedule(tvm.IRModule({"main": _func({"q": x, "k": x, "v": x}, params)}), seed=1)
    attention_cuda(sch, sch.get_sblock("attn_out"), target)
    frames, log = _ptxas_frames(_cuda_source(tvm.compile(sch.mod, target=target)), arch, tmp_path)
    assert frames and all(f == ("0", "0", "0") for f in frames), log


def test_separated_head_ranges_compute_the_same_attention():
    """``separate_head_ranges`` (what the tensor-core template asks for): slices and plain parameters, same result."""
    from tvm_fusion_ext.ops import OperatorCall, call_op
    from tvm_fusion_ext.schedules.attention_blocks import separate_head_ranges
    from tvm_fusion_ext.testing import build_module, run_relax

    x_np, params, want = _head_range_case(2, 9, 4, 2, 16, 1, True)
    x = relax.Var("x", relax.TensorType(list(x_np.shape), "float32"))
    call = separate_head_ranges(OperatorCall("fused_attention", {"q": x, "k": x, "v": x}, params))
    assert not any(p in call.params for p in ("heads", "kv_heads", "q_head_start", "k_head_start", "v_head_start"))
    assert all(isinstance(call.inputs[n], relax.Call) for n in "qkv")  # every operand is a range of x
    assert separate_head_ranges(call) is None

    def body(bb):
        return call_op(bb, "fused_attention", {n: bb.emit(e) for n, e in call.inputs.items()}, call.params)

    _close(run_relax(build_module([x], body), [x_np]), want)
