"""ReadAttentionHeadsInPlace: attention on the split pieces of one projection reads them as head ranges of it.

Reference: the unfused graph (stock TVM legalization). Counters prove the rule fired and the split is gone;
negative cases keep the split (another reader) or refuse (a piece off the head grid), with the right numbers."""

import math

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from tvm_fusion_ext.compile import compile_model
from tvm_fusion_ext.testing import build_module, fuse, fused_calls, run_before_after
from tvm_fusion_ext.transform.graph import op_name

RULE = "ReadAttentionHeadsInPlace"
E = 24  # model width: 3 heads of 8, so no piece width equals another axis by coincidence


def _split_attention(heads=3, head_dim=8, lead=0, tail=0, k_is_output=False, rows=(2, 5)):
    """``x [B, S, E] @ W`` split into ``[lead | q | k | v | tail]`` columns; BERT's head split and attention on the
    pieces. ``lead`` shifts the pieces off column 0 (no head boundary when it is not a multiple of head_dim)."""
    rng = np.random.default_rng(0)
    width = heads * head_dim
    total = lead + 3 * width + tail
    x = relax.Var("x", relax.TensorType([*rows, E], "float32"))
    w = rng.standard_normal((E, total)).astype("float32") * 0.3
    b, s = rows

    def build(bb):
        qkv = bb.emit(relax.op.matmul(x, relax.const(w)))
        cuts = [c for c in (lead + i * width for i in range(4)) if 0 < c < total]
        parts = bb.emit(relax.op.split(qkv, cuts, axis=-1))
        first = 1 if lead else 0
        q, k, v = (bb.emit(relax.op.reshape(bb.emit(relax.TupleGetItem(parts, first + i)), [b, s, heads, head_dim]))
                   for i in range(3))
        qt = bb.emit(relax.op.permute_dims(q, [0, 2, 1, 3]))
        kt = bb.emit(relax.op.permute_dims(k, [0, 2, 3, 1]))
        vt = bb.emit(relax.op.permute_dims(v, [0, 2, 1, 3]))
        scores = bb.emit(relax.op.divide(relax.op.matmul(qt, kt), relax.const(math.sqrt(head_dim), "float32")))
        ctx = bb.emit(relax.op.matmul(relax.op.nn.softmax(scores, axis=-1), vt))
        out = bb.emit(relax.op.reshape(relax.op.permute_dims(ctx, [0, 2, 1, 3]), [b, s, width]))
        return relax.Tuple([out, bb.emit(relax.TupleGetItem(parts, first + 1))]) if k_is_output else out

    return build_module([x], build)


def _splits(mod) -> int:
    return sum(1 for blk in mod["main"].body.blocks for bd in blk.bindings if op_name(bd.value) == "relax.split")


def _attention_params(mod) -> dict:
    from tvm_fusion_ext.transform.graph import FunctionGraph

    graph = FunctionGraph(mod["main"], mod)
    (params,) = [c[2] for c in map(graph.fused_call, graph.var2val.values()) if c and c[0] == "fused_attention"]
    return params


def _x(rows, seed=1):
    return np.random.default_rng(seed).standard_normal((*rows, E)).astype("float32")


def test_attention_reads_qkv_heads_from_the_projection():
    mod = _split_attention()
    fused, report = fuse(mod)
    assert report.count(RULE) == 1 and report.fused["attention"] == 1, report.summary()
    assert report.to_dict()["attention_heads_in_place"] == 1 and "heads in place (no split copy): 1" in report.summary()
    assert _splits(fused) == 0  # the pieces are never copied apart
    params = _attention_params(fused)
    assert (params["heads"], params["kv_heads"]) == (3, 3)
    assert [params[f"{n}_head_start"] for n in "qkv"] == [0, 3, 6]
    before, after = run_before_after(mod, fused, [_x((2, 5))])
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)


def test_pieces_after_other_columns_start_at_their_head():
    # [16 | q | k | v | 8]: 16 columns are two 8-wide heads, so q starts at head 2 of the view
    mod = _split_attention(lead=16, tail=8)
    fused, report = fuse(mod)
    assert report.count(RULE) == 1, report.summary()
    assert [_attention_params(fused)[f"{n}_head_start"] for n in "qkv"] == [2, 5, 8]
    before, after = run_before_after(mod, fused, [_x((2, 5))])
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)


def test_a_piece_off_the_head_grid_is_refused_and_keeps_its_split():
    mod = _split_attention(lead=4)  # q starts at column 4 of 8-wide heads
    fused, report = fuse(mod)
    assert report.count(RULE) == 0 and report.fused["attention"] == 1, report.summary()
    reasons = [e.detail for e in report.refused if e.rule == RULE]
    assert reasons and "not on a boundary of 8-wide heads" in reasons[0], reasons
    assert _splits(fused) == 1 and "heads" not in _attention_params(fused)
    before, after = run_before_after(mod, fused, [_x((2, 5))])
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)


def test_a_split_with_another_reader_stays_and_attention_still_reads_in_place():
    mod = _split_attention(k_is_output=True)  # a decoder returning its K piece (present key)
    fused, report = fuse(mod)
    assert report.count(RULE) == 1, report.summary()
    assert _splits(fused) == 1
    before, after = run_before_after(mod, fused, [_x((2, 5))])
    for a, b in zip(after, before):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # 20 s: two scheduled symbolic builds
def test_symbolic_rows_compiled_match_the_unfused_build():
    b, s = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    mod = _split_attention(rows=(b, s))
    fused = compile_model(mod, "llvm")
    assert fused.report.count(RULE) == 1, fused.report.summary()
    plain = compile_model(mod, "llvm", fuse_graph=False)
    vms = [relax.VirtualMachine(c.executable, tvm.cpu()) for c in (fused, plain)]
    for rows in [(1, 1), (2, 7), (3, 33)]:
        x = tvm.runtime.tensor(_x(rows, seed=sum(rows)))
        got, want = (vm["main"](x).numpy() for vm in vms)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_fused_module_keeps_the_rule_when_rows_are_symbolic():
    b, s = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    fused, report = fuse(_split_attention(rows=(b, s)))
    assert report.count(RULE) == 1 and _splits(fused) == 0, report.summary()
    assert fused_calls(fused)["fused_attention"] == 1


def test_only_the_split_operand_reads_in_place_beside_bhsd_cache_operands():
    """A decoder step: Q is a piece of the projection (BSHD), K and V come from the KV cache in BHSD with more keys
    than queries. Only Q becomes a head range; the head counts come from each operand's own head axis."""
    from tvm_fusion_ext.ops import call_op
    from tvm_fusion_ext.transform.attention_qkv_heads import AttentionHeadsInPlaceRule

    rng = np.random.default_rng(2)
    x = relax.Var("x", relax.TensorType([2, 3, E], "float32"))
    k = relax.Var("k", relax.TensorType([2, 3, 11, 8], "float32"))
    v = relax.Var("v", relax.TensorType([2, 3, 11, 8], "float32"))
    w = relax.const(rng.standard_normal((E, 2 * E)).astype("float32"))

    def build(bb):
        parts = bb.emit(relax.op.split(bb.emit(relax.op.matmul(x, w)), 2, axis=-1))
        q = bb.emit(relax.op.reshape(bb.emit(relax.TupleGetItem(parts, 1)), [2, 3, 3, 8]))
        return call_op(bb, "fused_attention", {"q": q, "k": k, "v": v},
                       {"scale": 0.35, "k_layout": "BHSD", "v_layout": "BHSD"})

    mod = build_module([x, k, v], build)
    fused, report = fuse(mod, AttentionHeadsInPlaceRule())
    assert report.count(RULE) == 1 and [e.detail for e in report.applied] == ["q"], report.summary()
    params = _attention_params(fused)
    assert (params["heads"], params["kv_heads"], params["q_head_start"]) == (3, 3, 3)
    inputs = [_x((2, 3), seed=3), *rng.standard_normal((2, 2, 3, 11, 8)).astype("float32")]
    before, after = run_before_after(mod, fused, inputs)
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)
