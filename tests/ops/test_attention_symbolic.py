"""fused_attention with batch and sequence known only at run time: one kernel, compiled once, against numpy at
several sizes. The CPU template pads the query rows to its tile (``query_block``, set by its prepare_operator)
and schedules the kernel; without that padding it declines and the fallback still computes the right thing."""

import json
import warnings

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

from tvm_fusion_ext.compile.variants.causal_skip import SkipMaskedKeyBlocks
from tvm_fusion_ext.compile.pipeline import compile_model, prepare
from tvm_fusion_ext.compile.schedule import schedule
from tvm_fusion_ext.ops import call_op
from tvm_fusion_ext.ops.registry import make_prim_func
from tvm_fusion_ext.schedules.cpu.attention import SYMBOLIC_QUERY_TILE, AttentionCPU
from tvm_fusion_ext.testing import build_module
from tvm_fusion_ext.targets import resolve_target

from test_attention_gqa_rope import _reference as _gqa_reference
from test_attention_op import _reference

TARGET = resolve_target("llvm")
H, D = 4, 32


def _module(params, heads_kv=H, mask=True, dv=D):
    batch, seq = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    q = relax.Var("q", relax.TensorType([batch, seq, H, D], "float32"))
    k = relax.Var("k", relax.TensorType([batch, seq, heads_kv, D], "float32"))
    v = relax.Var("v", relax.TensorType([batch, seq, heads_kv, dv], "float32"))
    args = [q, k, v]
    if mask:
        args.append(relax.Var("mask", relax.TensorType([batch, 1, 1, seq], "float32")))
    inputs = dict(zip(("q", "k", "v", "mask"), args))
    return build_module(args, lambda bb: call_op(bb, "fused_attention", inputs, params))


def _inputs(batch, seq, heads_kv=H, seed=0, dv=D):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, seq, H, D)).astype("float32")
    k, v = (rng.standard_normal((batch, seq, heads_kv, d)).astype("float32") for d in (D, dv))
    mask = np.where(rng.random((batch, 1, 1, seq)) < 0.25, -1e4, 0.0).astype("float32")
    mask[..., 0] = 0.0  # one visible key per row at least
    return q, k, v, mask


def _run(executable, arrays):
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


def _attention_kernel(mod):
    return next(f for gv, f in mod.functions_items()
                if isinstance(f, tirx.PrimFunc) and gv.name_hint.startswith("fused_attention"))


@pytest.mark.parametrize("causal", [pytest.param(False, marks=pytest.mark.slow), True])  # ~65 s each
def test_one_kernel_serves_every_length(causal):
    mod = _module({"scale": 0.125, "causal": causal})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a template failure (fallback warning) fails the test
        compiled = compile_model(mod, TARGET, fuse_graph=False)
    for batch, seq in ((1, 1), (1, 16), (2, 37), (3, 64), (1, 129)):
        arrays = _inputs(batch, seq, seed=seq)
        want = _reference(*arrays, 0.125, causal, ("BSHD",) * 4)
        np.testing.assert_allclose(_run(compiled.executable, arrays), want, rtol=2e-5, atol=2e-5)


def test_value_head_dim_of_its_own_at_every_length():
    # multi-head latent attention with symbolic batch and sequence: v's head dim (16) is not q/k's (32)
    mod = _module({"scale": 0.125, "causal": True}, dv=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = compile_model(mod, TARGET, fuse_graph=False)
    for batch, seq in ((1, 1), (2, 37), (1, 129)):
        arrays = _inputs(batch, seq, seed=seq, dv=16)
        got = _run(compiled.executable, arrays)
        assert got.shape == (batch, seq, H, 16)
        np.testing.assert_allclose(got, _reference(*arrays, 0.125, True, ("BSHD",) * 4), rtol=2e-5, atol=2e-5)


def test_template_pads_query_rows_and_writes_back_the_real_ones():
    lowered = prepare(_module({"scale": 0.125}), TARGET, fuse_graph=False)[0]
    kernel = _attention_kernel(lowered)
    assert f'"query_block": {SYMBOLIC_QUERY_TILE}' in kernel.attrs["tfx.params"]
    sch = s_tir.Schedule(tvm.IRModule({"main": kernel}))
    assert AttentionCPU().decline(sch, sch.get_sblock("attn_rows"), TARGET) is None
    script = _attention_kernel(schedule(lowered, TARGET)).script()
    assert "T.parallel" in script and 'T.sblock("attn_rows")' not in script  # the finish is inlined into the copy
    assert "T.vectorized" in script


@pytest.mark.slow  # ~30 s on 2 cores
def test_unpadded_symbolic_rows_are_declined_and_the_fallback_is_right():
    batch, seq = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    ty = relax.TensorType([batch, seq, H, D], "float32")
    func = make_prim_func("fused_attention", {"q": ty, "k": ty, "v": ty}, {"scale": 0.125})
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    reason = AttentionCPU().decline(sch, sch.get_sblock("attn_out"), TARGET)
    assert reason is not None and "query rows" in reason and "not padded" in reason
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    lib = tvm.compile(schedule(mod, TARGET), target=TARGET)
    q, k, v, _ = _inputs(2, 19)
    out = tvm.runtime.empty(q.shape, "float32", tvm.cpu())
    lib["main"](*[tvm.runtime.tensor(a) for a in (q, k, v)], out)
    np.testing.assert_allclose(out.numpy(), _reference(q, k, v, None, 0.125, False, ("BSHD",) * 4),
                               rtol=2e-5, atol=2e-5)


@pytest.mark.slow  # 10 s
def test_grouped_rotary_causal_with_symbolic_lengths():
    batch, seq = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    hkv = 2
    names = ("q", "k", "v", "q_cos", "q_sin", "k_cos", "k_sin")
    shapes = ([batch, seq, H, D], [batch, seq, hkv, D], [batch, seq, hkv, D]) + ([1, seq, D],) * 4
    args = [relax.Var(n, relax.TensorType(s, "float32")) for n, s in zip(names, shapes)]
    params = {"scale": 0.2, "causal": True, "q_rope": "half", "k_rope": "half"}
    mod = build_module(args, lambda bb: call_op(bb, "fused_attention", dict(zip(names, args)), params))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = compile_model(mod, TARGET, fuse_graph=False)
    for batch_, seq_ in ((1, 5), (2, 40)):
        q, k, v, _ = _inputs(batch_, seq_, heads_kv=hkv, seed=seq_)
        angles = np.arange(seq_)[:, None] * (10000.0 ** (-np.arange(D // 2) / (D // 2)))[None]
        cos = np.concatenate([np.cos(angles)] * 2, -1)[None].astype("float32")
        sin = np.concatenate([np.sin(angles)] * 2, -1)[None].astype("float32")
        got = _run(compiled.executable, (q, k, v, cos, sin, cos, sin))
        want = _gqa_reference(q, k, v, 0.2, True, "half", ((cos, sin), (cos, sin)))
        np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-5)


def test_causal_key_loop_bound_is_symbolic():
    lowered = prepare(_module({"scale": 0.125, "causal": True}, mask=False), TARGET, fuse_graph=False)[0]
    scheduled = schedule(lowered, TARGET)
    before = _attention_kernel(scheduled)
    after = _attention_kernel(SkipMaskedKeyBlocks()(scheduled))
    assert not tvm_ffi.structural_equal(before, after)  # the flash loop now stops at the tile's diagonal


def test_cuda_pipeline_keeps_the_whole_key_loop():
    """On an H100 (``scripts/gpu_check.py``) the key-block bound broke the CUDA kernels with run-time sizes it
    touched, symbolic causal attention and packed attention, which matched numpy without it: the CUDA pipeline
    schedules the template's kernel and leaves its key loop whole (the pass would bound it)."""
    from tvm_fusion_ext.compile import ApplyTemplates
    from tvm_fusion_ext.compile.variants.decode import DispatchDecode

    cuda = resolve_target("cuda:sm_90")
    lowered = prepare(_module({"scale": 0.125, "causal": True}, mask=False), cuda, fuse_graph=False)[0]
    templated = ApplyTemplates(cuda)(lowered)
    # the pipeline = the template's kernel behind the one-row decode branch, nothing else
    expected = DispatchDecode(cuda, ApplyTemplates(cuda, fallback=False))(templated)
    assert tvm_ffi.structural_equal(_attention_kernel(schedule(lowered, cuda)), _attention_kernel(expected))
    assert not tvm_ffi.structural_equal(_attention_kernel(SkipMaskedKeyBlocks()(templated)),
                                        _attention_kernel(templated))


@pytest.mark.parametrize("seq,causal,tile", [(197, False, 32), (37, True, 32), (5, False, 4), (64, False, None),
                                             (8, False, None)])
def test_static_rows_that_leave_a_tail_tile_are_padded_too(seq, causal, tile):
    """ViT-B/16's 197 rows with 32-row tiles leave a 5-row tail, which predicated every stage under the flash
    loop (2.7 ms against 0.9 ms at 200 rows): the template pads static rows to whole tiles as it pads
    symbolic ones (5 rows: tiles of 4). Rows that fill their tiles (64, 8) keep the plain kernel."""
    args = [relax.Var(n, relax.TensorType([2, seq, H, D], "float32")) for n in "qkv"]
    args.append(relax.Var("mask", relax.TensorType([2, 1, 1, seq], "float32")))
    mod = build_module(args, lambda bb: call_op(bb, "fused_attention", dict(zip(("q", "k", "v", "mask"), args)),
                                                {"scale": 0.125, "causal": causal}))
    kernel = _attention_kernel(prepare(mod, TARGET, fuse_graph=False)[0])
    assert json.loads(str(kernel.attrs["tfx.params"])).get("query_block") == tile
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = compile_model(mod, TARGET, fuse_graph=False)
    arrays = _inputs(2, seq, seed=seq)
    want = _reference(*arrays, 0.125, causal, ("BSHD",) * 4)
    np.testing.assert_allclose(_run(compiled.executable, arrays), want, rtol=2e-5, atol=2e-5)
