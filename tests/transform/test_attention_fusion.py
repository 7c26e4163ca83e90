"""FuseMultiHeadAttention: every spelling fuses to one fused_attention with no S×T score tensor left, and
computes what the unfused graph computes; near misses are refused with a reason and leave the module alone."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_fusion_ext.ops import params_of
from tvm_fusion_ext.testing import (assert_refused, build_module, fuse, fused_calls, random_inputs, run_before_after,
                                    tensor_shapes)
from tvm_fusion_ext.transform import Canonicalize, FuseMultiHeadAttention

from _attention_graphs import B, D, F32_MIN, H, S, T, attention_module, numpy_attention

RULE = "FuseMultiHeadAttention"
ATTENTION = FuseMultiHeadAttention()


def _no_scores_left(mod, s=S, t=T):
    """No tensor holding per-head scores/probabilities (B·H·S·T elements, last axes S×T) is left."""
    return [sh for sh in tensor_shapes(mod) if sh[-2:] == [s, t] and int(np.prod(sh)) >= B * H * s * t] == []


def _attention_params(mod):
    calls = [v for gv, v in mod.functions_items() if isinstance(v, tvm.tirx.PrimFunc)]
    return [params_of(f) for f in calls if f.attrs is not None and "tfx.op" in f.attrs]


def _steps(canonicalize):
    return (Canonicalize(), FuseMultiHeadAttention()) if canonicalize else (FuseMultiHeadAttention(),)


def _assert_fused(mod, canonicalize=False, seed=0, s=S, t=T, rtol=1e-5, atol=1e-5, inputs=None):
    fused, report = fuse(mod, *_steps(canonicalize))
    assert report.fused["attention"] == 1, report.summary()
    assert fused_calls(fused) == {"fused_attention": 1}
    assert _no_scores_left(fused, s, t), tensor_shapes(fused)
    inputs = inputs if inputs is not None else random_inputs(mod, seed=seed)
    expected, actual = run_before_after(mod, fused, inputs)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)
    return fused, report, inputs, actual


# --- positive cases: scale spellings, head split/merge, plain BHSD, 3-D --------------------------------

@pytest.mark.parametrize("scale", ["div", "mul", "q"])
def test_scale_spellings_fuse(scale):
    mod = attention_module("bshd", scale=scale)
    fused, _, inputs, actual = _assert_fused(mod)
    (params,) = _attention_params(fused)
    assert params["scale"] == pytest.approx(1 / np.sqrt(D), rel=1e-6)
    assert params["q_layout"] == params["k_layout"] == params["v_layout"] == params["out_layout"] == "BSHD"
    np.testing.assert_allclose(actual, numpy_attention(inputs), rtol=1e-4, atol=1e-5)


def test_split_sdpa_scale_fuses_after_canonicalize():
    mod = attention_module("bshd", scale="split")
    _, report, _, _ = _assert_fused(mod, canonicalize=True)
    assert report.canonicalized.get("MergeSplitAttentionScale") == 1


def test_split_scale_is_read_directly_too():
    # without Canonicalize the scales on q and kᵀ are walked as part of the operands
    _assert_fused(attention_module("bshd", scale="split"))


def test_k_split_via_two_permutes():
    fused, _, _, _ = _assert_fused(attention_module("bshd", k_split="0213+T"))
    (params,) = _attention_params(fused)
    assert params["k_layout"] == "BSHD"


def test_plain_bhsd_inputs():
    fused, _, inputs, actual = _assert_fused(attention_module("bhsd", mask=(B, 1, 1, T)))
    (params,) = _attention_params(fused)
    assert params["q_layout"] == params["out_layout"] == "BHSD"
    np.testing.assert_allclose(actual, numpy_attention(inputs, "bhsd", mask=(B, 1, 1, T)), rtol=1e-4, atol=1e-5)


def test_3d_batch_heads_inputs():
    _assert_fused(attention_module("3d", scale="mul", mask=(1, S, T)))


def test_output_without_head_merge_keeps_bhsd():
    fused, _, _, _ = _assert_fused(attention_module("bshd", head_merge=False))
    (params,) = _attention_params(fused)
    assert params["out_layout"] == "BHSD"


def test_cross_attention_s_ne_t():
    _assert_fused(attention_module("bshd", s=3, t=T), s=3)


@pytest.mark.parametrize("dk,dv", [(6, 4), (2, 8)])
def test_value_head_dim_of_its_own_fuses(dk, dv):
    # multi-head latent attention (q/k heads of nope + rope dims, v heads narrower) and LeViT (v wider): the
    # head split of v and the merge of the output use v's head dim, q·kᵀ contracts over q/k's
    q, k, v = _var("q", (B, S, H * dk)), _var("k", (B, T, H * dk)), _var("v", (B, T, H * dv))

    def build(bb):
        def heads(x, n, d, perm):
            return bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(x, (B, n, H, d))), perm))

        sc = lambda s: bb.emit(relax.op.multiply(s, relax.const(dk ** -0.5, "float32")))  # noqa: E731
        o = _attend(bb, heads(q, S, dk, [0, 2, 1, 3]), heads(k, T, dk, [0, 2, 3, 1]),
                    heads(v, T, dv, [0, 2, 1, 3]), sc)
        return bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(o, [0, 2, 1, 3])), (B, S, H * dv)))

    fused, _, (xq, xk, xv), actual = _assert_fused(build_module([q, k, v], build))
    (params,) = _attention_params(fused)
    assert params["out_layout"] == "BSHD"
    split = lambda x, n, d: x.reshape(B, n, H, d).transpose(0, 2, 1, 3)  # noqa: E731
    want = _bhsd_attention(split(xq, S, dk), split(xk, T, dk), split(xv, T, dv), 0.0, scale=dk ** -0.5)
    np.testing.assert_allclose(actual, want.transpose(0, 2, 1, 3).reshape(B, S, H * dv), rtol=1e-4, atol=1e-5)


# --- masks ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(B, 1, 1, T), (B, 1, S, T), (1, 1, S, T), (S, T), (T,)])
def test_additive_mask_shapes(shape):
    fused, _, inputs, actual = _assert_fused(attention_module("bshd", mask=shape))
    assert _attention_params(fused)[0]["causal"] is False
    np.testing.assert_allclose(actual, numpy_attention(inputs, mask=shape), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mask_value", [float("-inf"), F32_MIN])
def test_constant_causal_mask_becomes_causal_flag(mask_value):
    mod = attention_module("bshd", mask="causal_add", mask_value=mask_value)
    fused, _, inputs, actual = _assert_fused(mod)
    assert _attention_params(fused)[0]["causal"] is True
    assert [sh for sh in tensor_shapes(fused) if sh[-2:] == [S, T]] == []  # not even the mask is left
    np.testing.assert_allclose(actual, numpy_attention(inputs, mask="causal_add"), rtol=1e-4, atol=1e-5)


def test_causal_where_fuses_after_canonicalize():
    mod = attention_module("bshd", s=T, mask="causal_where")
    fused, report, _, _ = _assert_fused(mod, canonicalize=True, s=T)
    assert report.canonicalized.get("BoolMaskToAdditive") == 1
    assert _attention_params(fused)[0]["causal"] is True


def test_non_causal_constant_mask_stays_a_mask():
    # -10000 is an ordinary (finite) score, not the op's -inf: it must be passed as a mask
    mod = attention_module("bshd", mask="causal_add", mask_value=-10000.0)
    fused, _, _, _ = _assert_fused(mod)
    assert _attention_params(fused)[0]["causal"] is False


@pytest.mark.parametrize("mask_value", [-10000.0, F32_MIN])
def test_multiplicative_causal_mask_fuses_after_canonicalize(mask_value):
    # OpenAI GPT: s · tril + -1e4 · (1 - tril) read as a multiplicative mask, attention left unfused
    mod = attention_module("bshd", mask="causal_mul", mask_value=mask_value)
    fused, report, inputs, actual = _assert_fused(mod, canonicalize=True)
    assert report.canonicalized.get("MultiplicativeMaskToAdditive") == 1
    np.testing.assert_allclose(actual, numpy_attention(inputs, mask="causal_mul", mask_value=mask_value),
                               rtol=1e-4, atol=1e-5)


def test_bool_mask_on_a_view_of_3d_scores_fuses_after_canonicalize():
    # FSMT (fairseq): q, k, v as [B·H, S, D]; the [B·H, S, T] scores are viewed as [B, H, S, T] for a where-mask
    # and viewed back for the softmax
    q, k, v = (relax.Var(n, relax.TensorType((B * H, n_, D), "float32")) for n, n_ in (("q", S), ("k", T), ("v", T)))
    m = relax.Var("mask", relax.TensorType((B, 1, 1, T), "bool"))

    def build(bb):
        sc = bb.emit(relax.op.matmul(bb.emit(relax.op.multiply(q, relax.const(1 / np.sqrt(D), "float32"))),
                                     bb.emit(relax.op.permute_dims(k, [0, 2, 1]))))
        sc4 = bb.emit(relax.op.reshape(sc, (B, H, S, T)))
        masked = bb.emit(relax.op.where(m, relax.const(F32_MIN, "float32"), sc4))
        p = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.reshape(masked, (B * H, S, T)))))
        return bb.emit(relax.op.matmul(p, v))

    mod = build_module([q, k, v, m], build)
    inputs = random_inputs(mod, seed=7)
    inputs[3] = np.zeros((B, 1, 1, T), bool)
    inputs[3][1, ..., -2:] = True  # the last two keys of batch 1 are padding
    # the operator sees B·H heads of one batch, so the mask reaches it broadcast to the scores' size (the
    # view-mask reading); what is checked is that the attention fuses and computes the same numbers
    fused, report = fuse(mod, *_steps(True))
    assert report.canonicalized.get("BoolMaskToAdditive") == 1
    assert report.fused["attention"] == 1 and fused_calls(fused) == {"fused_attention": 1}, report.summary()
    _, actual = run_before_after(mod, fused, inputs)
    qq, kk, vv = (a.astype("float64") for a in inputs[:3])
    sc = (qq @ kk.transpose(0, 2, 1) / np.sqrt(D)).reshape(B, H, S, T)
    sc = np.where(inputs[3], F32_MIN, sc).reshape(B * H, S, T)
    e = np.exp(sc - sc.max(-1, keepdims=True))
    np.testing.assert_allclose(actual, (e / e.sum(-1, keepdims=True)) @ vv, rtol=1e-4, atol=1e-5)


def test_bool_mask_fuses_after_canonicalize():
    mod = attention_module("bshd", mask="bool", guard=True)
    inputs = random_inputs(mod, seed=3)
    inputs[3][0, 0, 0, :] = False  # batch 0: every key hidden -> NaN rows, zeroed by the guard
    fused, report, _, actual = _assert_fused(mod, canonicalize=True, inputs=inputs)
    assert report.canonicalized.get("BoolMaskToAdditive") == 1
    assert np.all(actual[0] == 0) and np.isfinite(actual).all()
    np.testing.assert_allclose(actual, numpy_attention(inputs, mask="bool", guard=True), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mask_value", [F32_MIN, -10000.0])
def test_nan_guard_over_finite_mask_is_dropped_then_fused(mask_value):
    # the dynamo SDPA form: where(mask, 0, -3.4e38) cannot make a row all -inf, so the guard is a no-op
    mod = attention_module("bshd", mask="bool_add", mask_value=mask_value, guard=True)
    inputs = random_inputs(mod, seed=2)
    inputs[3][1] = False  # a fully masked batch: uniform rows, identical with and without the guard
    _, report, _, actual = _assert_fused(mod, canonicalize=True, inputs=inputs)
    assert report.canonicalized.get("DropSoftmaxNanGuard") == 1
    if mask_value == F32_MIN:  # (s - 10000 keeps only ~3 digits of s in fp32: compare with the fp32 graph only)
        np.testing.assert_allclose(actual, numpy_attention(inputs, mask="bool_add", mask_value=mask_value),
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mask", ["bool_add", (B, 1, 1, T)])
def test_nan_guard_over_inf_mask_is_absorbed(mask):
    # the legacy SDPA form (where(mask, 0, -inf)) or a float mask input can hide whole rows: the guard stays
    # through Canonicalize and the op's "no visible key -> 0" takes its place
    mod = attention_module("bshd", mask=mask, guard=True)
    inputs = random_inputs(mod, seed=1)
    if mask == "bool_add":
        inputs[3][1] = False
    else:
        inputs[3][...] = 0.0
        inputs[3][1] = float("-inf")
    _, report = fuse(mod, Canonicalize())
    assert report.canonicalized.get("DropSoftmaxNanGuard") is None
    assert any("-inf" in e.detail for e in report.refused)
    fused, _, _, actual = _assert_fused(mod, canonicalize=True, inputs=inputs)
    assert np.all(actual[1] == 0) and np.isfinite(actual).all()
    assert "nan-guard" in [e for e in _applied(mod)][0]


def _applied(mod):
    _, report = fuse(mod, Canonicalize(), FuseMultiHeadAttention())
    return [e.detail for e in report.applied if e.kind == "attention"]


def test_fuses_every_layer():
    mod = attention_module("bshd", mask=(B, 1, 1, T), s=T, layers=3)
    fused, report = fuse(mod, FuseMultiHeadAttention())
    assert report.fused["attention"] == 3
    assert fused_calls(fused) == {"fused_attention": 3}
    assert _no_scores_left(fused, T, T)


# --- negatives: near misses are refused with a reason and the module is left exactly as it was ------------

def test_softmax_not_over_keys_is_refused():
    assert_refused(attention_module("bshd", softmax_axis=2), ATTENTION, rule=RULE, reason="softmax is over axis 2")


def test_probs_used_elsewhere_is_refused():
    assert_refused(attention_module("bshd", probs_used=True), ATTENTION, rule=RULE, reason="is also used by")


def test_non_constant_scale_is_refused():
    mod = attention_module("bshd", scale_var=True)
    assert_refused(mod, ATTENTION, rule=RULE, reason="scale is not a scalar constant")


def _capped_attention(q, k, v, mask, cap, scale=D ** -0.5):
    """Independent reference (float64): softmax(cap · tanh(scale · q kᵀ / cap) + mask) v, all BHSD."""
    sc = scale * (q.astype("float64") @ np.swapaxes(k.astype("float64"), -1, -2))
    sc = cap * np.tanh(sc / cap) + mask
    e = np.exp(sc - sc.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v.astype("float64")


@pytest.mark.parametrize("mask", [None, "bool_add", "causal_add"])
def test_soft_capped_logits_fuse(mask):
    # Gemma 2: cap · tanh(s / cap) of the scaled scores, the masks added after it. Inputs are scaled up so that
    # most scores lie where tanh bends (|s| > cap): plain attention is far from the answer there.
    mod = attention_module("bshd", scale="mul", mask=mask, softcap=2.0)
    inputs = [x * 4 if x.dtype == np.float32 else x for x in random_inputs(mod, seed=3)]
    fused, report, _, actual = _assert_fused(mod, canonicalize=True, inputs=inputs)
    (params,) = _attention_params(fused)
    assert params["softcap"] == pytest.approx(2.0) and params["scale"] == pytest.approx(D ** -0.5, rel=1e-6)
    assert params["causal"] is (mask == "causal_add")
    assert any("softcap 2" in e.detail for e in report.applied if e.kind == "attention")
    xq, xk, xv = (x.reshape(B, -1, H, D).transpose(0, 2, 1, 3) for x in inputs[:3])
    t = xk.shape[2]
    if mask == "bool_add":
        add = np.where(inputs[3], 0.0, float(np.finfo("float32").min))
    elif mask == "causal_add":
        add = np.where(np.arange(t)[None, :] > np.arange(S)[:, None] + (t - S), -np.inf, 0.0)
    else:
        add = 0.0
    want = _capped_attention(xq, xk, xv, add, 2.0).transpose(0, 2, 1, 3).reshape(actual.shape)
    np.testing.assert_allclose(actual, want, rtol=1e-4, atol=1e-5)
    plain = _capped_attention(xq, xk, xv, add, 1e9).transpose(0, 2, 1, 3).reshape(actual.shape)
    assert np.abs(actual - plain).max() > 1e-2  # the cap changed the answer: a test that can fail


def test_soft_capping_with_factors_around_it_fuses():
    # c · tanh(a · q kᵀ) in any spelling: the factors outside the tanh are the cap, those inside the scale
    q, k, v = _var("q", (B, H, S, D)), _var("k", (B, H, T, D)), _var("v", (B, H, T, D))

    def build(bb):
        kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
        qs = bb.emit(relax.op.multiply(q, relax.const(0.5, "float32")))
        return _attend(bb, qs, kt, v, lambda sc: bb.emit(relax.op.divide(
            bb.emit(relax.op.multiply(relax.const(30.0, "float32"),
                                      bb.emit(relax.op.tanh(bb.emit(relax.op.multiply(sc, relax.const(0.1, "float32"))))))),
            relax.const(3.0, "float32"))))

    mod = build_module([q, k, v], build)
    inputs = [x * 3 for x in random_inputs(mod, seed=5)]
    fused, _, (xq, xk, xv), actual = _assert_fused(mod, inputs=inputs)
    (params,) = _attention_params(fused)
    assert params["softcap"] == pytest.approx(10.0)
    # 10 · tanh(0.05 · q kᵀ) = softcap · tanh(scale · q kᵀ / softcap) with scale 0.5
    np.testing.assert_allclose(actual, _capped_attention(xq, xk, xv, 0.0, 10.0, scale=0.5), rtol=1e-4, atol=1e-5)


def _capped_scores_module(inner):
    """softmax(2 · tanh(inner(q kᵀ) / 2)) v, ``inner`` adding whatever else sits inside the tanh."""
    q, k, v, m = _var("q", (B, H, S, D)), _var("k", (B, H, T, D)), _var("v", (B, H, T, D)), _var("m", (B, 1, 1, T))

    def build(bb):
        kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))

        def scores(sc):
            th = bb.emit(relax.op.tanh(bb.emit(relax.op.divide(inner(bb, sc, m), relax.const(2.0, "float32")))))
            return bb.emit(relax.op.multiply(th, relax.const(2.0, "float32")))

        return _attend(bb, q, kt, v, scores)

    return build_module([q, k, v, m], build)


def test_mask_inside_the_soft_capping_tanh_is_refused():
    # ONNX's reference caps after the bias: a hidden key (-inf) then weighs exp(-cap), not 0; not what the
    # operator computes
    mod = _capped_scores_module(lambda bb, sc, m: bb.emit(relax.op.add(sc, m)))
    assert_refused(mod, ATTENTION, rule=RULE, reason="a mask is added inside the soft-capping tanh")


def test_tanh_twice_or_another_function_of_the_scores_is_refused():
    twice = _capped_scores_module(lambda bb, sc, m: bb.emit(relax.op.tanh(sc)))
    assert_refused(twice, ATTENTION, rule=RULE, reason="pass through tanh before the softmax (besides one")
    sig = _capped_scores_module(lambda bb, sc, m: bb.emit(relax.op.sigmoid(sc)))
    assert_refused(sig, ATTENTION, rule=RULE, reason="the scores pass through sigmoid before the softmax")


def test_the_same_graph_without_soft_capping_fuses():
    _assert_fused(attention_module("bshd", scale="mul", mask="bool_add"), canonicalize=True)


def _var(name, shape, dtype="float32"):
    return relax.Var(name, relax.TensorType(shape, dtype))


def _attend(bb, q, kt, v, scores_fn):
    sc = scores_fn(bb.emit(relax.op.matmul(q, kt)))
    return bb.emit(relax.op.matmul(bb.emit(relax.op.nn.softmax(sc)), v))


def test_mask_over_merged_batch_heads_fuses_as_a_per_head_mask():
    # 4-D heads viewed as [B·H, S, D]: a mask with a B·H axis varies over batch and head; the operator reads it
    # reshaped to [B, H, 1, T] (the same values in the same order)
    q, k, v, m = _var("q", (B, H, S, D)), _var("k", (B, H, T, D)), _var("v", (B, H, T, D)), _var("m", (B * H, 1, T))

    def build(bb):
        q3, k3, v3 = (bb.emit(relax.op.reshape(x, (B * H, n, D))) for x, n in ((q, S), (k, T), (v, T)))
        kt = bb.emit(relax.op.permute_dims(k3, [0, 2, 1]))
        return _attend(bb, q3, kt, v3, lambda sc: bb.emit(relax.op.add(sc, m)))

    fused, _, (xq, xk, xv, xm), actual = _assert_fused(build_module([q, k, v, m], build))
    assert [B, H, 1, T] in tensor_shapes(fused)  # the mask as the operator reads it
    np.testing.assert_allclose(actual.reshape(B, H, S, D), _bhsd_attention(xq, xk, xv, xm.reshape(B, H, 1, T), scale=1.0),
                               rtol=1e-4, atol=1e-5)


def _bhsd_attention(q, k, v, mask, scale=D ** -0.5):
    """Independent reference (float64): softmax(scale · q kᵀ + mask) v, all BHSD."""
    sc = scale * (q.astype("float64") @ np.swapaxes(k.astype("float64"), -1, -2)) + mask
    e = np.exp(sc - sc.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v.astype("float64")


def _alibi_module(regroup_to):
    """BLOOM's attention as its dynamo export writes it: ALiBi bias [B·H, 1, T] added to [B·H, S, T] scores
    (``baddbmm``), the scores viewed as ``regroup_to``, the key-padding mask [B, 1, 1, T] added there."""
    q, k, v = _var("q", (B, S, H, D)), _var("k", (B, T, H, D)), _var("v", (B, H, T, D))
    alibi, pad = _var("alibi", (B, H, T)), _var("pad", (B, 1, 1, T))

    def build(bb):
        q3 = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(q, [0, 2, 1, 3])), (B * H, S, D)))
        k3 = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(k, [0, 2, 1, 3])), (B * H, T, D)))
        kt = bb.emit(relax.op.permute_dims(k3, [0, 2, 1]))
        sc = bb.emit(relax.op.multiply(bb.emit(relax.op.matmul(q3, kt)), relax.const(D ** -0.5, "float32")))
        sc = bb.emit(relax.op.add(sc, bb.emit(relax.op.reshape(alibi, (B * H, 1, T)))))
        sc = bb.emit(relax.op.reshape(sc, regroup_to))
        if len(regroup_to) == 4:
            sc = bb.emit(relax.op.add(sc, pad))
        p = bb.emit(relax.op.nn.softmax(sc))
        p = p if len(regroup_to) == 4 else bb.emit(relax.op.reshape(p, (B, H, S, T)))
        return bb.emit(relax.op.matmul(p, v))

    return build_module([q, k, v, alibi, pad], build)


def test_alibi_bias_on_merged_heads_then_padding_mask_fuses():
    mod = _alibi_module((B, H, S, T))
    fused, _, (xq, xk, xv, alibi, pad), actual = _assert_fused(mod)
    (params,) = _attention_params(fused)
    assert params["causal"] is False and params["q_layout"] == "BSHD"
    ref = _bhsd_attention(xq.transpose(0, 2, 1, 3), xk.transpose(0, 2, 1, 3), xv, alibi.reshape(B, H, 1, T) + pad)
    np.testing.assert_allclose(actual, ref, rtol=1e-4, atol=1e-5)


def test_alibi_as_the_legacy_exporter_writes_it_fuses_after_canonicalize():
    # BLOOM's legacy export: K and V pass through a one-input Concat (the empty cache), the probabilities are
    # viewed back as [B·H, S, T] for a 3-D matmul with V
    q, k, v = _var("q", (B, S, H, D)), _var("k", (B, T, H, D)), _var("v", (B, T, H, D))
    alibi, pad = _var("alibi", (B * H, 1, T)), _var("pad", (B, 1, 1, T))

    def build(bb):
        q4, k4, v4 = (bb.emit(relax.op.permute_dims(x, [0, 2, 1, 3])) for x in (q, k, v))
        k4, v4 = (bb.emit(relax.op.concat([x], axis=-2)) for x in (k4, v4))
        q3, k3, v3 = (bb.emit(relax.op.reshape(x, (B * H, n, D))) for x, n in ((q4, S), (k4, T), (v4, T)))
        sc = bb.emit(relax.op.matmul(q3, bb.emit(relax.op.permute_dims(k3, [0, 2, 1]))))
        sc = bb.emit(relax.op.add(bb.emit(relax.op.multiply(sc, relax.const(D ** -0.5, "float32"))), alibi))
        sc = bb.emit(relax.op.add(bb.emit(relax.op.reshape(sc, (B, H, S, T))), pad))
        p = bb.emit(relax.op.reshape(bb.emit(relax.op.nn.softmax(sc)), (B * H, S, T)))
        o = bb.emit(relax.op.reshape(bb.emit(relax.op.matmul(p, v3)), (B, H, S, D)))
        return bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(o, [0, 2, 1, 3])), (B, S, H * D)))

    mod = build_module([q, k, v, alibi, pad], build)
    fused, report, (xq, xk, xv, xa, xp), actual = _assert_fused(mod, canonicalize=True)
    assert report.canonicalized.get("DropSingleConcat") == 2, report.canonicalized
    (params,) = _attention_params(fused)
    assert params["q_layout"] == params["k_layout"] == params["v_layout"] == params["out_layout"] == "BSHD"
    ref = _bhsd_attention(*(x.transpose(0, 2, 1, 3) for x in (xq, xk, xv)), xa.reshape(B, H, 1, T) + xp)
    np.testing.assert_allclose(actual, ref.transpose(0, 2, 1, 3).reshape(B, S, H * D), rtol=1e-4, atol=1e-5)


def test_concat_of_two_tensors_is_no_identity():
    x, y = _var("x", (B, H, T, D)), _var("y", (B, H, T, D))
    mod = build_module([x, y], lambda bb: bb.emit(relax.op.concat([x, y], axis=-2)))
    _, report = fuse(mod, Canonicalize())
    assert "DropSingleConcat" not in report.canonicalized


def test_scores_reshaped_across_the_key_axis_are_not_attention():
    # [B·H, S, T] viewed as [B·H, T, S]: the softmax then mixes keys of different queries; nothing may fuse
    assert S != T
    mod = _alibi_module((B * H, T, S))
    fused, report = fuse(mod, *_steps(False))
    assert report.fused["attention"] == 0
    assert fused_calls(fused).get("fused_attention", 0) == 0


def test_mask_over_merged_batch_heads_without_batch_axis_fuses():
    # the same graph with a mask that has no B·H axis is fine
    q, k, v, m = _var("q", (B, H, S, D)), _var("k", (B, H, T, D)), _var("v", (B, H, T, D)), _var("m", (1, 1, T))

    def build(bb):
        q3, k3, v3 = (bb.emit(relax.op.reshape(x, (B * H, n, D))) for x, n in ((q, S), (k, T), (v, T)))
        kt = bb.emit(relax.op.permute_dims(k3, [0, 2, 1]))
        return _attend(bb, q3, kt, v3, lambda sc: bb.emit(relax.op.add(sc, m)))

    fused, _, _, _ = _assert_fused(build_module([q, k, v, m], build))
    (params,) = _attention_params(fused)
    assert params["q_layout"] == "BHSD"  # read from the 4-D tensors, not their [B·H, S, D] views


def test_interleaved_head_split_fuses_through_a_transposed_copy():
    # k split as [B, T, D, H] (head index innermost), no BSHD/BHSD view of it exists: the permuted Kᵀ tensor
    # [B, H, D, T] the graph makes is read through a transposed copy (refused until 2026-11-25)
    q, xk, v = _var("q", (B, H, S, D)), _var("xk", (B, T, H * D)), _var("v", (B, H, T, D))

    def build(bb):
        k4 = bb.emit(relax.op.reshape(xk, (B, T, D, H)))
        kt = bb.emit(relax.op.permute_dims(k4, [0, 3, 2, 1]))
        return _attend(bb, q, kt, v, lambda sc: sc)

    _, _, (xq, xkv, xv), actual = _assert_fused(build_module([q, xk, v], build))
    k = xkv.reshape(B, T, D, H).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(actual, _bhsd_attention(xq, k, xv, 0.0, scale=1.0), rtol=1e-4, atol=1e-5)


def test_multiplicative_mask_is_refused():
    q, k, v, m = _var("q", (B, H, S, D)), _var("k", (B, H, T, D)), _var("v", (B, H, T, D)), _var("m", (B, 1, 1, T))

    def build(bb):
        kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
        return _attend(bb, q, kt, v, lambda sc: bb.emit(relax.op.multiply(sc, m)))

    assert_refused(build_module([q, k, v, m], build), ATTENTION, rule=RULE, reason="multiplied by a tensor")


def test_channel_first_heads_with_keys_already_transposed_fuse():
    # SqueezeBERT: Q/K/V from 1×1 convolutions, channel-first [B, H·D, S]; each viewed [B, H, D, S]. Q and V are
    # transposed to [B, H, S, D]; K is multiplied as it is, already Kᵀ. The output goes back channel-first
    q, k, v = (_var(x, (B, H * D, n)) for x, n in (("q", S), ("k", T), ("v", T)))

    def build(bb):
        def heads(x, n):
            return bb.emit(relax.op.reshape(x, (B, H, D, n)))

        qh, vh = (bb.emit(relax.op.permute_dims(heads(x, n), [0, 1, 3, 2])) for x, n in ((q, S), (v, T)))
        sc = lambda s: bb.emit(relax.op.divide(s, relax.const(D ** 0.5, "float32")))  # noqa: E731
        o = _attend(bb, qh, heads(k, T), vh, sc)
        return bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(o, [0, 1, 3, 2])), (B, H * D, S)))

    fused, _, (xq, xk, xv), actual = _assert_fused(build_module([q, k, v], build))
    heads = lambda x, n: x.reshape(B, H, D, n).transpose(0, 1, 3, 2)  # noqa: E731
    want = _bhsd_attention(heads(xq, S), heads(xk, T), heads(xv, T), 0.0)
    np.testing.assert_allclose(actual, want.transpose(0, 1, 3, 2).reshape(B, H * D, S), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("images", [1, 2])
def test_shifted_window_mask_on_a_5d_view_of_the_scores(images):
    # Swin's shifted windows: the scores of images·nW windows viewed as [images, nW, H, N, N], a per-window mask
    # [1, nW, 1, N, N] added, viewed back. It varies over the windows, which are the operator's batch: the mask
    # is read reshaped to [nW, 1, N, N] for one image; for several, repeated per image ([images·nW, 1, N, N])
    nw, n = 3, 6
    q, k, v = (_var(x, (images * nw, H, n, D)) for x in "qkv")
    m = _var("m", (1, nw, 1, n, n))

    def build(bb):
        kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))

        def scores(sc):
            sc5 = bb.emit(relax.op.add(bb.emit(relax.op.reshape(sc, (images, nw, H, n, n))), m))
            return bb.emit(relax.op.reshape(sc5, (images * nw, H, n, n)))

        return _attend(bb, q, kt, v, scores)

    mod = build_module([q, k, v, m], build)
    fused, report = fuse(mod, ATTENTION)
    assert report.fused["attention"] == 1 and fused_calls(fused) == {"fused_attention": 1}, report.summary()
    scores = images * nw * H * n * n
    assert all(int(np.prod(sh)) < scores for sh in tensor_shapes(fused) if sh[-2:] == [n, n]), tensor_shapes(fused)
    xq, xk, xv, xm = inputs = random_inputs(mod, seed=0)
    expected, actual = run_before_after(mod, fused, inputs)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
    want = _bhsd_attention(xq, xk, xv, np.broadcast_to(xm, (images, nw, 1, n, n)).reshape(images * nw, 1, n, n),
                           scale=1.0)
    np.testing.assert_allclose(actual, want, rtol=1e-4, atol=1e-5)


def test_decomposed_relative_positions_on_a_view_splitting_queries_and_keys():
    # ViTDet (and SAM's image encoder): [B·H, S, T] scores viewed as [B·H, qh, qw, kh, kw], a bias per query and key
    # row and one per query and key column added there, viewed back. No grouping of (B, H, S, T) holds the view;
    # the biases reach the operator broadcast to the view and reshaped to [B, H, S, T], the scores' own order
    qh, qw, kh, kw = 2, 3, 3, 2
    s, t = qh * qw, kh * kw
    q, k, v = _var("q", (B, H, s, D)), _var("k", (B, H, t, D)), _var("v", (B, H, t, D))
    rel_h, rel_w = _var("rel_h", (B * H, qh, qw, kh, 1)), _var("rel_w", (B * H, qh, qw, 1, kw))

    def build(bb):
        q3, k3, v3 = (bb.emit(relax.op.reshape(x, (B * H, n, D))) for x, n in ((q, s), (k, t), (v, t)))
        kt = bb.emit(relax.op.permute_dims(k3, [0, 2, 1]))

        def scores(sc):
            sc5 = bb.emit(relax.op.reshape(sc, (B * H, qh, qw, kh, kw)))
            sc5 = bb.emit(relax.op.add(bb.emit(relax.op.add(sc5, rel_h)), rel_w))
            return bb.emit(relax.op.reshape(sc5, (B * H, s, t)))

        return _attend(bb, q3, kt, v3, scores)

    mod = build_module([q, k, v, rel_h, rel_w], build)
    fused, report = fuse(mod, ATTENTION)
    assert report.fused["attention"] == 1 and fused_calls(fused) == {"fused_attention": 1}, report.summary()
    xq, xk, xv, xh, xw = inputs = random_inputs(mod, seed=4)
    expected, actual = run_before_after(mod, fused, inputs)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
    bias = (np.broadcast_to(xh, (B * H, qh, qw, kh, kw)) + xw).reshape(B, H, s, t)
    np.testing.assert_allclose(actual.reshape(B, H, s, D), _bhsd_attention(xq, xk, xv, bias, scale=1.0),
                               rtol=1e-4, atol=1e-5)


def _per_head_scaled(op="multiply", scale_shape=(H, 1, 1), computed=False, mask_first=False):
    """Swin-v2's cosine attention: scores times a learned per-head logit scale, ``exp(min(s, log 100))``."""
    q, k, v = _var("q", (B, H, S, D)), _var("k", (B, H, T, D)), _var("v", (B, H, T, D))
    ls, m = _var("ls", scale_shape), _var("m", (B, 1, 1, T))

    def scores(bb, sc):
        if mask_first:
            sc = bb.emit(relax.op.add(sc, m))
        c = bb.emit(relax.op.exp(bb.emit(relax.op.minimum(ls, relax.const(4.6, "float32"))))) if computed else ls
        sc = bb.emit(getattr(relax.op, op)(sc, c))
        return sc if mask_first else bb.emit(relax.op.add(sc, m))

    def build(bb):
        kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
        return _attend(bb, q, kt, v, lambda sc: scores(bb, sc))

    return build_module([q, k, v, ls, m], build)


@pytest.mark.parametrize("op,computed", [("multiply", False), ("multiply", True), ("divide", False)])
def test_per_head_scale_is_applied_to_q(op, computed):
    mod = _per_head_scaled(op, computed=computed)
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal(sh).astype("float32") for sh in ((B, H, S, D), (B, H, T, D), (B, H, T, D))]
    inputs += [rng.uniform(1.0, 6.0, (H, 1, 1)).astype("float32"), rng.standard_normal((B, 1, 1, T)).astype("float32")]
    fused, _, _, actual = _assert_fused(mod, inputs=inputs)
    c = np.exp(np.minimum(inputs[3], 4.6)) if computed else inputs[3]
    c = 1.0 / c if op == "divide" else c
    want = _bhsd_attention(inputs[0] * c.astype("float64"), *inputs[1:3], inputs[4], scale=1.0)
    np.testing.assert_allclose(actual, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kwargs,reason", [
    (dict(scale_shape=(1, 1, 1, T)), "varies over more than the heads"),  # a multiplicative mask over the keys
    (dict(scale_shape=(B, H, 1, 1)), "varies over more than the heads"),
    (dict(mask_first=True), "a mask is added to the scores before they are multiplied by a per-head tensor"),
])
def test_per_head_scale_near_misses_are_refused(kwargs, reason):
    assert_refused(_per_head_scaled(**kwargs), ATTENTION, rule=RULE, reason=reason)


def test_bool_mask_without_canonicalize_is_not_fused():
    # where(mask, s, -inf) is not additive: only Canonicalize turns it into s + where(mask, 0, -inf)
    mod = attention_module("bshd", mask="bool")
    fused, report = fuse(mod, FuseMultiHeadAttention())
    assert report.fused["attention"] == 0
    tvm.ir.assert_structural_equal(fused, mod)
