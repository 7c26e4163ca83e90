"""Attention-side canonicalisations: NaN guard after softmax, boolean masks, split SDPA scale.

Each rewrite is checked against the graph it replaced (both compiled by TVM) on random inputs, including the
rows where the idioms matter (fully masked rows); each refusal leaves the module as it was and says why.
"""

import math

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_fusion_ext.testing import assert_refused, build_module, fuse, random_inputs, run_before_after, run_relax
from tvm_fusion_ext.transform.canonical.attention_scale import MergeSplitAttentionScale
from tvm_fusion_ext.transform.canonical.bool_mask import BoolMaskToAdditive
from tvm_fusion_ext.transform.canonical.multiplicative_mask import MultiplicativeMaskToAdditive
from tvm_fusion_ext.transform.canonical.softmax_nan_guard import DropSoftmaxNanGuard

B, H, S, T, D = 2, 3, 5, 7, 4
F32_MIN = float(np.finfo(np.float32).min)
NEG_INF = float("-inf")


def _c(v, dtype="float32"):
    return relax.const(v, dtype)


def _var(name, shape, dtype="float32"):
    return relax.Var(name, relax.TensorType(shape, dtype))


def _ops(mod):
    return [b.value.op.name for blk in mod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


def _assert_same_numbers(before, after, inputs):
    expected, actual = run_before_after(before, after, inputs)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


# --- DropSoftmaxNanGuard ------------------------------------------------------------------------------

def _guarded_probs(mask_kind, mask_value=F32_MIN, guarded="softmax", zero=0.0):
    """where(isnan(p), zero, p) with p = softmax(x + mask); mask_kind: "bool" (where(m, 0, NEG) built from a
    boolean input, the exports' form), "const" (a constant additive mask), "float_input" (a float mask input)."""
    q, kt = _var("q", (B, H, S, D)), _var("kt", (B, H, D, T))
    params = [q, kt]
    if mask_kind == "bool":
        m = _var("m", (B, 1, 1, T), "bool")
        params.append(m)
    elif mask_kind == "float_input":
        m = _var("m", (B, 1, 1, T))
        params.append(m)

    def build(bb):
        if mask_kind == "bool":
            add = bb.emit(relax.op.where(m, _c(0.0), _c(mask_value)))
        elif mask_kind == "const":
            add = relax.const(np.where(np.arange(T) > 3, mask_value, 0.0).astype("float32"))
        else:
            add = m
        s = bb.emit(relax.op.add(bb.emit(relax.op.matmul(q, kt)), add))
        p = bb.emit(relax.op.nn.softmax(s) if guarded == "softmax" else relax.op.exp(s))
        return bb.emit(relax.op.where(bb.emit(relax.op.isnan(p)), _c(zero), p))

    return build_module(params, build)


@pytest.mark.parametrize("mask_kind, mask_value", [("bool", F32_MIN), ("bool", -10000.0), ("const", F32_MIN)])
def test_guard_over_finite_mask_is_dropped(mask_kind, mask_value):
    mod = _guarded_probs(mask_kind, mask_value)
    out, report = fuse(mod, DropSoftmaxNanGuard())
    assert report.count("DropSoftmaxNanGuard") == 1
    assert "relax.isnan" not in _ops(out) and "relax.nn.softmax" in _ops(out)
    inputs = random_inputs(mod, seed=0)
    if mask_kind == "bool":
        inputs[2][0] = False  # batch 0 fully masked: uniform rows either way, no NaN to guard
    _assert_same_numbers(mod, out, inputs)


@pytest.mark.parametrize("mask_kind", ["bool", "const", "float_input"])
def test_guard_over_possible_inf_mask_is_kept(mask_kind):
    # -inf from a constant, or any value from a float mask input: a row can be all -inf, the guard matters
    mod = _guarded_probs(mask_kind, mask_value=NEG_INF)
    assert_refused(mod, DropSoftmaxNanGuard(), reason="may hold -inf")
    inputs = random_inputs(mod, seed=1)
    if mask_kind == "bool":
        inputs[2][0] = False
        out = run_relax(mod, inputs)
        assert np.all(out[0] == 0) and not np.isnan(out).any()  # what the guard is for


def test_kept_guard_is_an_expected_refusal_not_a_near_miss():
    """The guard over a possibly -inf mask is needed, so the report counts it apart from the near misses: ``fuse``
    lists it under its own heading, ``bench``/``demo`` (``list_expected=False``) in one line; the JSON says so."""
    mod = _guarded_probs("const", mask_value=NEG_INF)
    _, report = fuse(mod, DropSoftmaxNanGuard())
    assert len(report.refused) == 1 and report.near_misses == [] and len(report.expected_refusals) == 1
    assert report.to_dict()["refused"][0]["expected"] is True
    full = report.summary()
    assert "Near misses: none" in full and "Left in place on purpose (1;" in full and "may hold -inf" in full
    short = report.summary(list_expected=False)
    assert "Near misses: none" in short and "may hold -inf" not in short
    assert "Left in place on purpose: 1 (DropSoftmaxNanGuard 1;" in short


def test_refused_guard_over_non_softmax_is_a_near_miss():
    _, report = fuse(_guarded_probs("bool", guarded="exp"), DropSoftmaxNanGuard())
    assert len(report.near_misses) == 1 and report.expected_refusals == []
    assert report.to_dict()["refused"][0]["expected"] is False
    assert "Near misses (1):" in report.summary(list_expected=False)


def test_guard_over_non_softmax_is_refused():
    mod = _guarded_probs("bool", guarded="exp")
    assert_refused(mod, DropSoftmaxNanGuard(), reason="not a softmax")


def test_guard_with_nonzero_fill_is_refused():
    mod = _guarded_probs("bool", zero=1.0)
    assert_refused(mod, DropSoftmaxNanGuard(), reason="not the constant 0")


# --- BoolMaskToAdditive -------------------------------------------------------------------------------

def _where_softmax(neg, keep_first=True, extra=False, mask_shape=(B, 1, 1, T)):
    x, m = _var("x", (B, H, S, T)), _var("m", mask_shape, "bool")
    params = [x, m]
    if extra:
        pad = _var("pad", (B, 1, 1, T))
        params.append(pad)

    def build(bb):
        sel = relax.op.where(m, x, _c(neg)) if keep_first else relax.op.where(m, _c(neg), x)
        s = bb.emit(sel)
        if extra:
            s = bb.emit(relax.op.add(s, pad))
        return bb.emit(relax.op.nn.softmax(s))

    return build_module(params, build)


@pytest.mark.parametrize("neg", [NEG_INF, F32_MIN])
@pytest.mark.parametrize("keep_first", [True, False])
@pytest.mark.parametrize("extra", [False, True])
def test_where_mask_becomes_additive(neg, keep_first, extra):
    mod = _where_softmax(neg, keep_first, extra)
    out, report = fuse(mod, BoolMaskToAdditive())
    assert report.count("BoolMaskToAdditive") == 1
    # the select now runs at the mask's shape and is added to the scores
    wheres = [b for blk in out["main"].body.blocks for b in blk.bindings
              if isinstance(b.value, relax.Call) and b.value.op.name == "relax.where"]
    assert [[int(d) for d in w.var.ty.shape.values] for w in wheres] == [[B, 1, 1, T]]
    inputs = random_inputs(mod, seed=2)
    inputs[1][1] = not keep_first  # batch 1: every key hidden (NaN rows with -inf, uniform rows with F32_MIN)
    _assert_same_numbers(mod, out, inputs)


@pytest.mark.parametrize("keep_first", [True, False])
def test_where_mask_on_a_view_of_the_scores_becomes_additive(keep_first):
    # FSMT (fairseq): [B·H, S, T] scores viewed as [B, H, S, T], masked with where, viewed back for the softmax
    x, m = _var("x", (B * H, S, T)), _var("m", (B, 1, 1, T), "bool")

    def build(bb):
        x4 = bb.emit(relax.op.reshape(x, (B, H, S, T)))
        sel = bb.emit(relax.op.where(m, x4, _c(F32_MIN)) if keep_first else relax.op.where(m, _c(F32_MIN), x4))
        return bb.emit(relax.op.nn.softmax(bb.emit(relax.op.reshape(sel, (B * H, S, T)))))

    mod = build_module([x, m], build)
    out, report = fuse(mod, BoolMaskToAdditive())
    assert report.count("BoolMaskToAdditive") == 1
    inputs = random_inputs(mod, seed=6)
    inputs[1] = np.zeros((B, 1, 1, T), bool)
    inputs[1][0, ..., :3] = inputs[1][1, ..., 2:] = True  # keys kept (where(keep, s, NEG)) or hidden
    hide = ~inputs[1] if keep_first else inputs[1]
    ref = np.where(hide, F32_MIN, inputs[0].astype("float64").reshape(B, H, S, T)).reshape(B * H, S, T)
    e = np.exp(ref - ref.max(-1, keepdims=True))
    np.testing.assert_allclose(run_before_after(mod, out, inputs)[1], e / e.sum(-1, keepdims=True), rtol=1e-5,
                               atol=1e-6)


def test_small_negative_fill_is_refused():
    # where(m, s, -10000) and s + where(m, 0, -10000) differ on fully masked rows (uniform vs softmax(s))
    assert_refused(_where_softmax(-10000.0), BoolMaskToAdditive(), reason="not -inf")


def test_already_additive_mask_is_left_alone():
    x, m = _var("x", (B, H, S, T)), _var("m", (B, 1, 1, T), "bool")
    mod = build_module([x, m], lambda bb: bb.emit(relax.op.nn.softmax(
        bb.emit(relax.op.add(x, bb.emit(relax.op.where(m, _c(0.0), _c(NEG_INF))))))))
    out, report = fuse(mod, BoolMaskToAdditive())
    tvm.ir.assert_structural_equal(out, mod)
    assert report.applied == [] and report.refused == []


# --- MultiplicativeMaskToAdditive ---------------------------------------------------------------------

def _tril01(s=S, t=T):
    return np.tril(np.ones((s, t), "float32"), t - s)


def _product_softmax(factor, added, b_first=False, c_first=False, extra=False):
    """softmax(x · factor + added [+ pad]) with constant factor and added (OpenAI GPT's causal mask)."""
    x = _var("x", (B, H, S, T))
    params = [x]
    if extra:
        pad = _var("pad", (B, 1, 1, T))
        params.append(pad)

    def build(bb):
        b, c = relax.const(np.asarray(factor, "float32")), relax.const(np.asarray(added, "float32"))
        prod = bb.emit(relax.op.multiply(b, x) if b_first else relax.op.multiply(x, b))
        sc = bb.emit(relax.op.add(c, prod) if c_first else relax.op.add(prod, c))
        if extra:
            sc = bb.emit(relax.op.add(sc, pad))
        return bb.emit(relax.op.nn.softmax(sc))

    return build_module(params, build)


@pytest.mark.parametrize("b_first", [False, True])
@pytest.mark.parametrize("c_first", [False, True])
@pytest.mark.parametrize("extra", [False, True])
def test_multiplicative_mask_becomes_additive(b_first, c_first, extra):
    tril = _tril01()
    mod = _product_softmax(tril, -10000.0 * (1 - tril), b_first, c_first, extra)
    out, report = fuse(mod, MultiplicativeMaskToAdditive())
    assert report.count("MultiplicativeMaskToAdditive") == 1
    assert "relax.multiply" not in _ops(out)
    inputs = random_inputs(mod, seed=4)
    if extra:  # a padding mask (finfo.min) on the last key of batch 1: every row keeps key 0
        inputs[1] = np.zeros((B, 1, 1, T), "float32")
        inputs[1][1, ..., -1] = F32_MIN
    x = inputs[0].astype("float64")
    ref = np.where(tril == 1, x, -10000.0) + (inputs[1] if extra else 0.0)  # the product form, independently
    e = np.exp(ref - ref.max(-1, keepdims=True))
    _, actual = run_before_after(mod, out, inputs)
    np.testing.assert_allclose(actual, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_multiplicative_mask_cut_from_a_causal_buffer():
    # OpenAI GPT's dynamo export: b = buffer[:, :, :S, :T] (strided slices of a larger constant) and the added
    # term -1e4 · (1 - b) left unfolded; both are evaluated from the constants
    x = _var("x", (B, H, S, T))

    def build(bb):
        buf = relax.const(np.tril(np.ones((1, 1, 16, 16), "float32"), T - S))
        b = bb.emit(relax.op.strided_slice(bb.emit(relax.op.strided_slice(buf, [2], [0], [S])), [3], [0], [T]))
        c = bb.emit(relax.op.multiply(bb.emit(relax.op.subtract(_c(1.0), b)), _c(-10000.0)))
        return bb.emit(relax.op.nn.softmax(bb.emit(relax.op.add(bb.emit(relax.op.multiply(x, b)), c))))

    mod = build_module([x], build)
    out, report = fuse(mod, MultiplicativeMaskToAdditive())
    assert report.count("MultiplicativeMaskToAdditive") == 1
    inputs = random_inputs(mod, seed=5)
    ref = np.where(_tril01() == 1, inputs[0].astype("float64"), -10000.0)
    e = np.exp(ref - ref.max(-1, keepdims=True))
    np.testing.assert_allclose(run_before_after(mod, out, inputs)[1], e / e.sum(-1, keepdims=True), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("factor, added, reason", [
    (0.5 * _tril01(), -10000.0 * (1 - _tril01()), "other than 0 and 1"),  # a real product, not a mask
    (_tril01(), -100.0 * (1 - _tril01()), "does not hide the key"),  # exp(-100) is not 0: weights would change
    (_tril01(), -10000.0 * (1 - _tril01()) + 1.0, "not 0 where the factor keeps"),
    # a row the factor empties: the product form weighs its keys evenly, the additive one by their scores
    (np.concatenate([np.zeros((1, T), "float32"), _tril01()[1:]]), -10000.0 * (1 - _tril01()), "keeps no key"),
])
def test_multiplicative_mask_near_misses_are_refused(factor, added, reason):
    if "keeps no key" in reason:
        added = -10000.0 * (1 - factor)
    assert_refused(_product_softmax(factor, added), MultiplicativeMaskToAdditive(), reason=reason)


def test_product_with_an_input_is_left_alone():
    # the factor is not a constant: a gate or a multiplicative mask given at run time, not rewritten
    x, g = _var("x", (B, H, S, T)), _var("g", (B, 1, 1, T))
    mod = build_module([x, g], lambda bb: bb.emit(relax.op.nn.softmax(bb.emit(relax.op.add(
        bb.emit(relax.op.multiply(x, g)), relax.const(np.zeros((S, T), "float32")))))))
    assert_refused(mod, MultiplicativeMaskToAdditive(), reason="not computed from constants")


# --- MergeSplitAttentionScale -------------------------------------------------------------------------

def _split_scale(op_q="multiply", op_k="multiply", cq=D ** -0.25, ck=D ** -0.25, k_factor_shape=()):
    q, kt = _var("q", (B, H, S, D)), _var("kt", (B, H, D, T))

    def build(bb):
        fq = relax.op.multiply if op_q == "multiply" else relax.op.divide
        fk = relax.op.multiply if op_k == "multiply" else relax.op.divide
        ck_const = relax.const(np.full(k_factor_shape, ck, "float32")) if k_factor_shape else _c(ck)
        return bb.emit(relax.op.matmul(bb.emit(fq(q, _c(cq))), bb.emit(fk(kt, ck_const))))

    return build_module([q, kt], build)


@pytest.mark.parametrize("op_q, op_k, cq, ck, expected", [
    ("multiply", "multiply", D ** -0.25, D ** -0.25, 1 / math.sqrt(D)),
    ("divide", "divide", D ** 0.25, D ** 0.25, 1 / math.sqrt(D)),
    ("multiply", "divide", -0.5, 4.0, -0.125),
])
def test_split_scale_moves_after_matmul(op_q, op_k, cq, ck, expected):
    mod = _split_scale(op_q, op_k, cq, ck)
    out, report = fuse(mod, MergeSplitAttentionScale())
    assert report.count("MergeSplitAttentionScale") == 1
    ops = _ops(out)
    assert ops == ["relax.matmul", "relax.multiply"], ops
    factor = [b.value.args[1] for blk in out["main"].body.blocks for b in blk.bindings
              if isinstance(b.value, relax.Call) and b.value.op.name == "relax.multiply"][0]
    assert float(factor.value.numpy()) == pytest.approx(expected, rel=1e-6)
    _assert_same_numbers(mod, out, random_inputs(mod, seed=3))


def test_tensor_factor_is_refused():
    # a per-column factor on kᵀ scales the product's columns: it does not commute out as one scalar
    mod = _split_scale(k_factor_shape=(T,))
    assert_refused(mod, MergeSplitAttentionScale(), reason="not a nonzero scalar constant")


def test_one_sided_scale_is_left_alone():
    q, kt = _var("q", (B, H, S, D)), _var("kt", (B, H, D, T))
    mod = build_module([q, kt], lambda bb: bb.emit(relax.op.matmul(bb.emit(relax.op.multiply(q, _c(0.5))), kt)))
    out, report = fuse(mod, MergeSplitAttentionScale())
    tvm.ir.assert_structural_equal(out, mod)
    assert report.applied == []
