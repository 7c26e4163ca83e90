"""fused_attention with grouped-query K/V and rotary Q/K, on CPU (template defaults) against numpy; the causal
key-block bound (compile/variants/causal_skip.py) on the scheduled kernel; CUDA compile checks of the same kernels."""

import re
import shutil
import subprocess

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir

from tvm_fusion_ext.compile.variants.causal_skip import SkipMaskedKeyBlocks
from tvm_fusion_ext.ops.registry import make_prim_func
from tvm_fusion_ext.schedules.cpu.attention import attention_cpu

from test_attention_op import _cuda_source

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def _rotate(x, style):
    if style == "half":
        h = x.shape[-1] // 2
        return np.concatenate([-x[..., h:], x[..., :h]], -1)
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = -x[..., 1::2], x[..., 0::2]
    return out


def _reference(q, k, v, scale, causal, rope, tables):
    """BSHD inputs; K/V heads repeated the repeat_kv way; float64."""
    q, k, v = (a.transpose(0, 2, 1, 3).astype("float64") for a in (q, k, v))
    if rope:
        (qc, qs), (kc, ks) = ((c[:, None].astype("float64"), s[:, None].astype("float64")) for c, s in tables)
        q, k = q * qc + _rotate(q, rope) * qs, k * kc + _rotate(k, rope) * ks
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    sc = q @ k.transpose(0, 1, 3, 2) * scale
    S, T = sc.shape[-2:]
    if causal:
        sc = np.where(np.arange(T)[None] <= np.arange(S)[:, None] + T - S, sc, -np.inf)
    m = sc.max(-1, keepdims=True)
    p = np.where(np.isneginf(sc), 0.0, np.exp(sc - np.where(np.isneginf(m), 0, m)))
    den = p.sum(-1, keepdims=True)
    out = np.where(den > 0, (p @ v) / np.where(den > 0, den, 1), 0.0)
    return out.transpose(0, 2, 1, 3)


def _arrays(B, H, HKV, S, T, D, rope, table_batch=1, dtype="float32", seed=0):
    rng = np.random.default_rng(seed)
    arrays = {"q": rng.standard_normal((B, S, H, D)).astype(dtype),
              "k": rng.standard_normal((B, T, HKV, D)).astype(dtype),
              "v": rng.standard_normal((B, T, HKV, D)).astype(dtype)}
    tables = []
    if rope:
        for name, n in (("q", S), ("k", T)):
            ang = rng.standard_normal((table_batch, n, D)).astype("float32")
            arrays[f"{name}_cos"], arrays[f"{name}_sin"] = np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)
            tables.append((arrays[f"{name}_cos"], arrays[f"{name}_sin"]))
    return arrays, tables


def _func(arrays, params):
    ty = lambda a: relax.TensorType(list(a.shape), str(a.dtype))  # noqa: E731
    return make_prim_func("fused_attention", {n: ty(a) for n, a in arrays.items()}, params).with_attr(
        "global_symbol", "main")


def _params(causal, rope, key_block=None):
    params = {"scale": 0.3, "causal": causal, "q_layout": "BSHD", "k_layout": "BSHD", "v_layout": "BSHD",
              "out_layout": "BSHD"}
    if rope:
        params.update(q_rope=rope, k_rope=rope)
    if key_block:
        params["key_block"] = key_block
    return params


def _scheduled(func):
    sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
    attention_cpu(sch, sch.get_sblock("attn_out"), TARGET)
    return SkipMaskedKeyBlocks()(sch.mod)


@pytest.mark.parametrize("B,H,HKV,S,T,D,causal,rope,table_batch,key_block", [
    (1, 4, 2, 37, 37, 16, True, None, 1, 8),          # GQA, causal over five key blocks
    (2, 4, 1, 20, 20, 16, False, "interleaved", 2, None),  # MQA, per-batch tables
    (1, 6, 3, 33, 33, 32, True, "half", 1, 16),
    (1, 2, 2, 9, 21, 16, True, "half", 1, 8),         # T > S: the causal diagonal is offset
    (1, 4, 2, 21, 9, 16, True, None, 1, 8),           # T < S: leading rows see no key (0)
])
def test_grouped_rotary_causal(B, H, HKV, S, T, D, causal, rope, table_batch, key_block):
    arrays, tables = _arrays(B, H, HKV, S, T, D, rope, table_batch)
    mod = _scheduled(_func(arrays, _params(causal, rope, key_block)))
    lib = tvm.compile(mod, target=TARGET)
    out = tvm.runtime.empty((B, S, H, D), "float32")
    lib(*[tvm.runtime.tensor(a) for a in arrays.values()], out)
    want = _reference(arrays["q"], arrays["k"], arrays["v"], 0.3, causal, rope, tables)
    np.testing.assert_allclose(out.numpy(), want, rtol=2e-5, atol=2e-5)


def test_float16_grouped_rotary():
    arrays, tables = _arrays(1, 4, 2, 24, 24, 16, "half", dtype="float16")
    lib = tvm.compile(_scheduled(_func(arrays, _params(True, "half"))), target=TARGET)
    out = tvm.runtime.empty((1, 24, 4, 16), "float16")
    lib(*[tvm.runtime.tensor(a) for a in arrays.values()], out)
    want = _reference(*(arrays[n].astype("float32") for n in ("q", "k", "v")), 0.3, True, "half",
                      [(c.astype("float32"), s.astype("float32")) for c, s in tables])
    np.testing.assert_allclose(out.numpy().astype("float32"), want, rtol=3e-3, atol=3e-3)


def test_kv_stages_are_per_kv_head():
    # the K copy the kernel makes is (B, Hkv, ...): repeated K/V never exist
    arrays, _ = _arrays(1, 8, 2, 16, 16, 16, None)
    func = _func(arrays, _params(True, None))
    shapes = re.findall(r"attn_kt = T\.sblock_alloc_buffer\(\((\d+), (\d+),", func.script())
    assert shapes == [("1", "2")]


@pytest.mark.parametrize("params,message", [
    ({"q_rope": "half"}, "needs q_cos and q_sin"),
    ({"q_rope": "sideways"}, "q_rope must be one of"),
])
def test_rejects_bad_rotary_arguments(params, message):
    arrays, _ = _arrays(1, 4, 2, 8, 8, 16, None)
    with pytest.raises(ValueError, match=message):
        _func(arrays, {**_params(False, None), **params})


def test_rejects_kv_heads_that_do_not_divide():
    arrays, _ = _arrays(1, 4, 3, 8, 8, 16, None)
    with pytest.raises(ValueError, match="K/V heads must divide Q heads"):
        _func(arrays, _params(False, None))


def test_rejects_tables_of_the_wrong_length():
    arrays, _ = _arrays(1, 4, 2, 8, 8, 16, "half")
    arrays["k_cos"] = arrays["k_cos"][:, :5]
    with pytest.raises(ValueError, match="k_cos/k_sin of shape"):
        _func(arrays, _params(False, "half"))


def test_tables_of_a_computed_symbolic_length_fit():
    # Wav2Vec2-Conformer's dynamic export: the rotary length is the feature encoder's output, seq // 10 - 1, which
    # reaches x and the tables as two equal expressions, not one object (a crash in the op's check before)
    from tvm import te, tirx

    from tvm_fusion_ext.ops.rope import check_rope_tables

    seq = tirx.Var("seq", "int64")
    length = lambda: seq // 10 - 1  # noqa: E731  (a fresh expression each time)
    cos, sin = (te.placeholder((length(), 1, 16), "float32", n) for n in ("cos", "sin"))
    check_rope_tables("fused_rope", "x", "half", cos, sin, length(), tirx.IntImm("int64", 4), 16)
    other = tirx.Var("other", "int64")
    with pytest.raises(ValueError, match="x_cos/x_sin of shape"):
        check_rope_tables("fused_rope", "x", "half", cos, sin, other // 10 - 1, tirx.IntImm("int64", 4), 16)


# -- the causal key-block bound -----------------------------------------------------------------------------------

def _key_block_loop(mod):
    """The extent of the loop the online-softmax update runs its key blocks in (as TVMScript text)."""
    text = mod["main"].script()
    update = text[text.index('T.sblock("attn_online_update")'):]
    var = re.search(r"v_rb = T\.axis\.reduce\(\d+, (\w+)\)", update).group(1)
    return var, re.search(rf"for {var} in range\(([^:]*)\):", text).group(1)


def test_causal_loop_is_bounded_by_the_query_tile():
    arrays, _ = _arrays(1, 2, 2, 512, 512, 64, None)
    func = _func(arrays, _params(True, None))
    sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
    attention_cpu(sch, sch.get_sblock("attn_out"), TARGET, {"query_tile": 5})  # 32-row tiles, 128-key blocks
    bounded = SkipMaskedKeyBlocks()(sch.mod)
    var, extent = _key_block_loop(bounded)
    assert _key_block_loop(sch.mod)[1] == "4"
    # 16 tiles per head: tile t sees key blocks 0 .. (32 t + 31) // 128
    assert "// 4 + 1" in extent and "% 16" in extent, extent


def test_non_causal_kernels_are_left_alone():
    arrays, _ = _arrays(1, 2, 2, 64, 64, 16, None)
    sch = s_tir.Schedule(tvm.IRModule({"main": _func(arrays, _params(False, None))}), seed=1)
    attention_cpu(sch, sch.get_sblock("attn_out"), TARGET)
    assert SkipMaskedKeyBlocks()(sch.mod).same_as(sch.mod)


def test_unrecognised_structure_is_left_alone():
    # an unscheduled kernel has no decomposed update block: nothing to bound, nothing broken
    arrays, _ = _arrays(1, 2, 2, 16, 16, 16, None)
    mod = tvm.IRModule({"main": _func(arrays, _params(True, None))})
    assert SkipMaskedKeyBlocks()(mod).same_as(mod)


# -- CUDA: compiled with nvcc, no GPU needed ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype,S,D,rope,arch", [
    ("float32", 64, 64, "half", "sm_90"),
    # tensor cores, rotary K through the key-blocked copy (40 s of nvcc: slow tier)
    pytest.param("float16", 128, 64, "half", "sm_80", marks=pytest.mark.slow),
    # tensor cores, grouped K/V read in place (19 s of nvcc: slow tier)
    pytest.param("float16", 64, 64, None, "sm_90", marks=pytest.mark.slow),
    ("float16", 40, 48, "interleaved", "sm_90"),    # SIMT path for a head dim that does not tile by 16
])
def test_cuda_grouped_rotary_compiles_without_spills(dtype, S, D, rope, arch, tmp_path, monkeypatch,
                                                   mma_attention):
    from tvm_fusion_ext.schedules.cuda.attention import attention_cuda

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")
    target = tvm.target.Target({"kind": "cuda", "arch": arch, "max_shared_memory_per_block": 49152,
                                "max_num_threads": 1024, "thread_warp_size": 32}, host="llvm")
    arrays, _ = _arrays(1, 4, 2, S, S, D, rope, dtype=dtype)
    sch = s_tir.Schedule(tvm.IRModule({"main": _func(arrays, _params(True, rope, 64 if dtype == "float16" else None))}),
                         seed=1)
    attention_cuda(sch, sch.get_sblock("attn_out"), target)
    mod = sch.mod  # as the CUDA pipeline builds it: no key-block bound (compile/schedule.py says why)
    src = _cuda_source(tvm.compile(mod, target=target))
    (tmp_path / "k.cu").write_text(src)
    res = subprocess.run(["nvcc", "--cubin", f"-arch={arch}", "-O3", "-w", "-Xptxas", "-v", "-o",
                          str(tmp_path / "k.cubin"), str(tmp_path / "k.cu")], capture_output=True, text=True, check=True)
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                        res.stdout + res.stderr)
    assert frames and all(f == ("0", "0", "0") for f in frames), res.stdout + res.stderr
    if dtype == "float16" and S % 16 == 0 and D % 16 == 0:
        assert "mma.sync" in src
