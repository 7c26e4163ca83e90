"""The split-K decode form of fused_attention (ops/decode_attention.py) with its CPU template
(schedules/cpu/decode_attention.py) against numpy: one query row per head against P cached keys plus the new
one, P = 0 included, grouped K/V heads (MHA, GQA, MQA), head dims 64 and 128, padded and left-padded pasts,
soft-capping, rotary Q, layouts; and the refusals of the form."""

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir

from tvm_fusion_ext.compile.codegen.row_prefetch import InsertRowPrefetch
from tvm_fusion_ext.ops.decode_attention import decode_key_block
from tvm_fusion_ext.ops.registry import make_prim_func
from tvm_fusion_ext.schedules.cpu.decode_attention import (PREFETCH_KEYS_AHEAD, DecodeAttentionCPU,
                                                             decode_attention_cpu)
from tvm_fusion_ext.schedules.registry import get_template
from tvm_fusion_ext.testing import decode_attention_reference as reference
from tvm_fusion_ext.testing import past_mask

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2, "mcpu": "znver3"})


def _types(arrays):
    return {n: relax.TensorType(list(a.shape), str(a.dtype)) for n, a in arrays.items() if a is not None}


def run(arrays, params, knobs=None, out_shape=None):
    func = make_prim_func("fused_attention", _types(arrays), params).with_attr("global_symbol", "main")
    sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
    decode_attention_cpu(sch, sch.get_sblock("dec_out"), TARGET, knobs)
    lib = tvm.compile(InsertRowPrefetch()(sch.mod), target=TARGET)  # as a build compiles it: K/V rows prefetched
    q = arrays["q"]
    out = tvm.runtime.empty(out_shape or (q.shape[0], 1, q.shape[2], arrays["v"].shape[-1]), str(q.dtype), tvm.cpu())
    lib(*[tvm.runtime.tensor(a) for a in arrays.values() if a is not None], out)
    return out.numpy()


def inputs(B, H, HKV, P, D, seed=0, mask=None):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, 1, H, D)).astype("float32")
    k, v = (rng.standard_normal((B, P + 1, HKV, D)).astype("float32") for _ in range(2))
    return {"q": q, "k": k, "v": v, "mask": mask}


def close(got, want, tol=2e-5):
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_template_is_registered():
    assert isinstance(get_template("tfx.decode_attention", TARGET), DecodeAttentionCPU)


@pytest.mark.parametrize("B,H,HKV,P,D,split_blocks", [
    (2, 4, 4, 0, 64, 4),       # no past: the new key alone
    (1, 16, 4, 1, 64, 4),
    (2, 8, 1, 7, 128, 1),      # MQA: eight query heads on one K/V head
    (1, 16, 4, 129, 64, 1),    # 130 keys: two 128-key blocks, two splits, the last two keys long
    (1, 16, 4, 300, 64, 2),    # 301 keys: three blocks, two splits, the last one block long
    (3, 8, 8, 129, 128, 2),
    (1, 32, 4, 1000, 64, 4),   # GQA 8: four splits
    (1, 4, 1, 1000, 128, 2),
])
def test_against_numpy(B, H, HKV, P, D, split_blocks):
    """Blocks of at most 128 keys, so that short caches span several blocks and splits (one block a split: no
    fold of blocks)."""
    a = inputs(B, H, HKV, P, D, seed=P + H)
    params = {"scale": float(D ** -0.5), "split_blocks": split_blocks, "key_block": min(128, decode_key_block(P + 1))}
    close(run(a, params), reference(a["q"], a["k"], a["v"], None, params["scale"]))


@pytest.mark.parametrize("left", [False, True])
def test_padded_and_left_padded_pasts(left):
    B, H, HKV, P, D = 3, 8, 2, 150, 64
    mask = past_mask(B, P, pad=(0, 37, 150), left=left)  # the last sequence has no past at all
    a = inputs(B, H, HKV, P, D, mask=mask)
    params = {"scale": 0.125, "causal": True, "split_blocks": 1, "key_block": 32}
    close(run(a, params), reference(a["q"], a["k"], a["v"], mask, 0.125))


def test_a_row_with_no_visible_key_is_zero_and_a_per_head_mask_is_read_per_head():
    B, H, HKV, P, D = 2, 4, 2, 20, 64
    rng = np.random.default_rng(3)
    mask = np.where(rng.random((B, H, 1, P + 1)) < 0.5, -np.inf, 0.0).astype("float32")
    mask[0, 1] = -np.inf  # head 1 of sequence 0 sees nothing
    a = inputs(B, H, HKV, P, D, mask=mask)
    got = run(a, {"scale": 0.125, "split_blocks": 1, "key_block": 8})
    assert (got[0, 0, 1] == 0).all()
    close(got, reference(a["q"], a["k"], a["v"], mask, 0.125))


def test_softcap_layouts_and_value_head_dim():
    B, H, HKV, P, D, DV = 2, 4, 2, 40, 64, 32
    rng = np.random.default_rng(5)
    q = rng.standard_normal((B, H, 1, D)).astype("float32")  # BHSD
    k = rng.standard_normal((B, HKV, P + 1, D)).astype("float32")  # BHSD
    v = rng.standard_normal((B, P + 1, HKV, DV)).astype("float32")
    params = {"scale": 0.125, "softcap": 2.0, "q_layout": "BHSD", "k_layout": "BHSD", "out_layout": "BHSD",
              "split_blocks": 1, "key_block": 16}
    got = run({"q": q, "k": k, "v": v}, params, out_shape=(B, H, 1, DV))
    want = reference(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v, None, 0.125, softcap=2.0)
    close(got, want.transpose(0, 2, 1, 3))


def test_rotary_query():
    """Rotary Q (rotate-half, the tables at the new token's position) read as the operator defines it."""
    B, H, HKV, P, D = 1, 4, 2, 33, 64
    rng = np.random.default_rng(7)
    a = inputs(B, H, HKV, P, D)
    a["q_cos"], a["q_sin"] = (rng.standard_normal((1, 1, D)).astype("float32") for _ in range(2))
    got = run(a, {"scale": 0.125, "q_rope": "half", "split_blocks": 1, "key_block": 16})
    q = a["q"].astype("float64")
    rotated = q * a["q_cos"] + np.concatenate([-q[..., D // 2:], q[..., :D // 2]], axis=-1) * a["q_sin"]
    close(got, reference(rotated, a["k"], a["v"], None, 0.125), tol=5e-5)


@pytest.mark.parametrize("D", [64, 20])
def test_q_k_takes_dot_products_along_the_head_dim_when_the_vector_divides_it(D):
    """A head dim of whole vectors: K rows are read where they lie, partial sums per lane (no key-contiguous copy
    of K); any other head dim keeps the copy. Both against numpy."""
    B, H, HKV, P = 2, 8, 2, 70
    a = inputs(B, H, HKV, P, D, seed=D)
    params = {"scale": float(D ** -0.5), "split_blocks": 1}
    func = make_prim_func("fused_attention", _types(a), params).with_attr("global_symbol", "main")
    sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
    decode_attention_cpu(sch, sch.get_sblock("dec_out"), TARGET)
    script = sch.mod.script()
    assert ('T.sblock("dec_kt")' in script) == (D % 8 != 0)  # AVX2: 8 lanes
    assert ("dec_qk_rf" in script) == (D % 8 == 0)
    close(run(a, params), reference(a["q"], a["k"], a["v"], None, params["scale"]))


@pytest.mark.parametrize("key_block", [8, 64])
def test_the_row_max_and_row_sum_reduce_in_vector_partials(key_block):
    """A key block's row max and row sum run as vector partials over its keys and a short tail per query head (a
    plain reduction is a scalar chain with a select and a mask load per key); the last block's padding keys and a
    left-padded past still give numpy's result."""
    B, H, HKV, P, D = 2, 8, 2, 77, 64
    mask = past_mask(B, P, pad=(0, P), left=True)  # the second sequence has no past
    a = inputs(B, H, HKV, P, D, seed=key_block, mask=mask)
    params = {"scale": 0.125, "split_blocks": 2, "key_block": key_block}
    func = make_prim_func("fused_attention", _types(a), params).with_attr("global_symbol", "main")
    sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
    decode_attention_cpu(sch, sch.get_sblock("dec_out"), TARGET)
    script = sch.mod.script()
    for partials in ("dec_bmax_rf_update", "dec_bsum_rf_update"):
        body = script.split(f'T.sblock("{partials}")')[0].rsplit("for ", 1)[1]
        assert body.startswith(("ax0 in T.vectorized(8)", "ax0 in T.vectorized(T.int64(8))")), body
    close(run(a, params), reference(a["q"], a["k"], a["v"], mask, 0.125))


@pytest.mark.parametrize("mask_heads", [0, 1, 8])
def test_each_score_is_computed_once_and_a_shared_mask_is_read_once_per_key(mask_heads):
    """The scores are a stage of their own (the row max and the exps read them); a mask the heads share (or none)
    is read once per key for the whole group, a per-head mask per query head. Left-padded and empty pasts, and
    the last split's padding keys, against numpy."""
    B, H, HKV, P, D = 2, 8, 2, 150, 64
    mask = None
    if mask_heads:
        mask = past_mask(B, P, pad=(3, P), left=True)  # (B, 1, 1, P + 1); the second sequence has no past
        mask = np.ascontiguousarray(np.repeat(mask, mask_heads, axis=1))
        if mask_heads > 1:
            mask[0, ::2, :, 40:60] = -np.inf  # even heads of the first sequence skip some keys
    a = inputs(B, H, HKV, P, D, seed=mask_heads, mask=mask)
    params = {"scale": 0.125, "split_blocks": 2, "key_block": 32}
    func = make_prim_func("fused_attention", _types(a), params).with_attr("global_symbol", "main")
    sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
    decode_attention_cpu(sch, sch.get_sblock("dec_out"), TARGET)
    script = sch.mod.script()
    assert 'T.sblock("dec_s")' in script
    shared = mask_heads <= 1
    assert ('T.sblock("dec_bias")' in script) == shared
    if mask is not None:  # the mask is read in one block only: the bias (once per key) or the scores (per head)
        readers = [blk for blk in script.split("T.sblock(")[1:] if "mask[" in blk.split("T.writes")[0]]
        assert [r.split('"')[1] for r in readers] == ["dec_bias" if shared else "dec_s"], readers
    close(run(a, params), reference(a["q"], a["k"], a["v"], mask, 0.125))


@pytest.mark.parametrize("split_blocks", [1, 3])
def test_a_split_of_one_block_takes_its_state_without_a_fold(split_blocks):
    """One key block a split: its max, sum and output are the split's as they are, with no exponential per query
    head and head dim (the online fold's rescaling); several blocks fold. Both against numpy, with a left-padded
    past that leaves whole blocks without a visible key."""
    B, H, HKV, P, D = 2, 8, 2, 200, 64
    mask = past_mask(B, P, pad=(0, 150), left=True)
    a = inputs(B, H, HKV, P, D, seed=split_blocks, mask=mask)
    params = {"scale": 0.125, "split_blocks": split_blocks, "key_block": 32}
    func = make_prim_func("fused_attention", _types(a), params).with_attr("global_symbol", "main")
    sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
    decode_attention_cpu(sch, sch.get_sblock("dec_out"), TARGET)
    fold = sch.mod.script().split('T.sblock("dec_split_update")')[1].split("T.sblock(")[0]
    assert ("T.floor(" in fold) == (split_blocks > 1), fold  # fast_exp rounds with floor
    close(run(a, params), reference(a["q"], a["k"], a["v"], mask, 0.125))


@pytest.mark.parametrize("out_layout", ["BSHD", "BHSD"])
def test_the_merge_of_the_splits_runs_under_the_output_loop(out_layout):
    """Two launches of the thread pool: the splits' tasks, then one loop over output rows that merges each row's
    splits and divides (a one-row call feels every launch); both output layouts against numpy."""
    B, H, HKV, P, D = 2, 8, 2, 300, 64
    a = inputs(B, H, HKV, P, D, seed=11, mask=past_mask(B, P, pad=(0, 7), left=True))
    params = {"scale": 0.125, "split_blocks": 1, "key_block": 64, "out_layout": out_layout}
    func = make_prim_func("fused_attention", _types(a), params).with_attr("global_symbol", "main")
    sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
    decode_attention_cpu(sch, sch.get_sblock("dec_out"), TARGET)
    script = sch.mod.script()
    assert script.count("T.parallel(") == 2, script
    assert script.index('T.sblock("dec_merge_init")') > script.rindex("T.parallel(")
    got = run(a, params, out_shape=(B, H, 1, D) if out_layout == "BHSD" else None)
    want = reference(a["q"], a["k"], a["v"], a["mask"], 0.125)
    close(got.transpose(0, 2, 1, 3) if out_layout == "BHSD" else got, want)


@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
@pytest.mark.parametrize("D", [64, 20])
def test_the_key_loop_prefetches_k_rows_ahead_and_v_rows_at_their_key(layout, D):
    """Per key of q·kᵀ: one prefetch per cache line of the K row PREFETCH_KEYS_AHEAD keys on and of the key's V row
    (read by p·v a little later), whatever the layout; the kernel's result is unchanged (``run`` compiles with the
    prefetches). A head dim that keeps the K copy has no such loop."""
    B, H, HKV, P = 2, 8, 2, 200
    a = inputs(B, H, HKV, P, D, seed=3)
    params = {"scale": float(D ** -0.5), "split_blocks": 2}
    if layout == "BHSD":
        a = dict(a, k=np.ascontiguousarray(a["k"].transpose(0, 2, 1, 3)),
                 v=np.ascontiguousarray(a["v"].transpose(0, 2, 1, 3)))
        params.update(k_layout="BHSD", v_layout="BHSD")
    func = make_prim_func("fused_attention", _types(a), params).with_attr("global_symbol", "main")
    sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
    decode_attention_cpu(sch, sch.get_sblock("dec_out"), TARGET)
    script = InsertRowPrefetch()(sch.mod).script()
    lines = D * 4 // 64
    assert script.count("T.prefetch(") == (2 * lines if D % 8 == 0 else 0), script
    if D % 8 == 0:
        assert script.count(f"+ {PREFETCH_KEYS_AHEAD}") >= lines, "K rows are not prefetched ahead"
    k, v = (a[n] if layout == "BSHD" else a[n].transpose(0, 2, 1, 3) for n in ("k", "v"))
    close(run(a, params), reference(a["q"], k, v, None, params["scale"]))


def test_knobs_change_the_schedule_not_the_result():
    a = inputs(1, 16, 4, 300, 64, seed=11)
    want = reference(a["q"], a["k"], a["v"], None, 0.125)
    knobs = {"qk_rows": 1, "pv_rows": 0, "unroll": 0, "qk_vec": [8, 8], "pv_vec": [16, 4], "p_vec": [4, 32]}
    close(run(a, {"scale": 0.125, "split_blocks": 2, "key_block": 128}, knobs), want)


def test_refusals():
    a = inputs(1, 4, 2, 5, 64)
    two_rows = dict(a, q=np.zeros((1, 2, 4, 64), "float32"))
    with pytest.raises(ValueError, match="takes one query row, got 2"):
        make_prim_func("fused_attention", _types(two_rows), {"scale": 0.1, "split_blocks": 1})
    with pytest.raises(ValueError, match="power-of-two key_block"):
        make_prim_func("fused_attention", _types(a), {"scale": 0.1, "split_blocks": 1, "key_block": 24})
    with pytest.raises(ValueError, match="split_blocks"):
        make_prim_func("fused_attention", _types(a), {"scale": 0.1, "split_blocks": 0})
    mismatched = dict(a, v=np.zeros((1, 7, 2, 64), "float32"))  # values cached for another length than keys
    with pytest.raises(ValueError, match="shapes disagree"):
        make_prim_func("fused_attention", _types(mismatched), {"scale": 0.1, "split_blocks": 1})
