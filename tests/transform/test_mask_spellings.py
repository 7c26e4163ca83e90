"""The padding-mask proof reads each exporter's spelling of the attention mask by what it computes.

Each spelling (the legacy ``(1 - m) · min``, its flat ``take``, the dynamo exporter's ``GatherND`` of ``m[b, j]``
from broadcast ``arange``s, a ``Gather`` at the identity, ``Expand``, ``masked_fill`` as ``Where``, boolean masks,
an ``IsNaN`` guard) is proven key-only, over symbolic batch and sequence. Beside each, a NEGATIVE that changes what
is computed (the query position instead of the key, shifted or reversed indices, padding not hidden, a causal term)
must be refused with a reason. Whole models: test_remove_padding.py (tiny encoders, MiniLM's two exports).
"""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_fusion_ext.transform.graph import FunctionGraph
from tvm_fusion_ext.transform.padding_mask import key_axis_reason, key_only_reason, padding_mask_input

BATCH, SEQ = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")
MIN = float(np.finfo(np.float32).min)


def _prove(build, batch=BATCH):
    """``build(bb, m) -> mask [B, ·, ·, S]`` inside ``main(m [batch, seq] int64)``; (padding reason, key-only
    reason) where None means proven."""
    m = relax.Var("attention_mask", relax.TensorType([batch, SEQ], "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [m]):
        with bb.dataflow():
            out = bb.emit_output(build(bb, m))
        bb.emit_func_output(out)
    mod = bb.get()
    graph = FunctionGraph(mod["main"], mod)
    found, reason = padding_mask_input(graph, [out])
    if found is None:
        return reason, None
    assert found.same_as(m)
    return None, key_only_reason(graph, out, m)


def _expand4(bb, x):
    """``x [B, S] -> [B, 1, 1, S]``: the key axis last."""
    return bb.emit(relax.op.expand_dims(x, [1, 2]))


def _additive(bb, m4):
    """The legacy ``(1 - float(m)) · finfo.min``."""
    inv = bb.emit(relax.op.subtract(relax.const(1.0), relax.op.astype(m4, "float32")))
    return relax.op.multiply(inv, relax.const(MIN))


def _where(bb, cond):
    """SDPA's ``where(bool mask, 0, finfo.min)``."""
    return relax.op.where(cond, relax.const(0.0), relax.const(MIN))


def _coords(bb, query_axis=False):
    """The dynamo exporter's GatherND indices ``[B, 1, 1, S, 2]`` (``[B, 1, S, 1, 2]`` with ``query_axis``):
    ``arange(batch)`` and ``arange(seq)`` unsqueezed, expanded to a common shape, stacked on a new last axis."""
    b = bb.emit(relax.op.expand_dims(relax.op.arange(0, BATCH, 1, "int64"), [1, 2, 3]))
    j = bb.emit(relax.op.expand_dims(relax.op.arange(0, SEQ, 1, "int64"), [0, 1, 3] if query_axis else [0, 1, 2]))
    shape = [BATCH, 1, SEQ, 1] if query_axis else [BATCH, 1, 1, SEQ]
    parts = [bb.emit(relax.op.expand_dims(relax.op.broadcast_to(x, shape), [4])) for x in (b, j)]
    return bb.emit(relax.op.concat(parts, axis=-1))


def _guarded(bb, idx):
    """The front end's negative-index guard around the indices, ``where(broadcast(False), idx + shape, idx)``."""
    shape = relax.op.shape_to_tensor(relax.ShapeExpr([BATCH, SEQ]))
    never = relax.op.broadcast_to(relax.const(False), relax.ShapeExpr([BATCH, 1, 1, SEQ, 2]))
    return bb.emit(relax.op.where(never, relax.op.add(idx, shape), idx))


# ---------------------------------------------------------------------------------------------------------------
# spellings that must be proven key-only, each with a negative that must be refused
# ---------------------------------------------------------------------------------------------------------------

def test_legacy_unsqueeze_sub_mul():
    assert _prove(lambda bb, m: _additive(bb, _expand4(bb, m))) == (None, None)


def test_legacy_reshape_with_a_static_batch_of_one():
    """``Reshape(m [1, S], [1, 1, 1, S])``: the unit batch has no axis of its own to follow."""
    def build(bb, m):
        return _additive(bb, bb.emit(relax.op.reshape(m, relax.ShapeExpr([1, 1, 1, SEQ]))))
    assert _prove(build, batch=1) == (None, None)


def test_legacy_mask_on_the_query_axis_is_refused():
    def build(bb, m):
        q = bb.emit(relax.op.reshape(m, relax.ShapeExpr([BATCH, 1, SEQ, 1])))
        return relax.op.broadcast_to(_additive(bb, q), relax.ShapeExpr([BATCH, 1, SEQ, SEQ]))
    padding, _ = _prove(build)
    assert padding is None  # padded queries are hidden, but it is no key mask:
    m = relax.Var("attention_mask", relax.TensorType([BATCH, SEQ], "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [m]):
        with bb.dataflow():
            out = bb.emit_output(build(bb, m))
        bb.emit_func_output(out)
    mod = bb.get()
    assert "off the key axis" in key_axis_reason(FunctionGraph(mod["main"], mod), out, m)


def test_legacy_flat_take():
    """The legacy dynamic export: ``take(reshape(m, [B·S, 1]), b·S + j)``."""
    def build(bb, m, stride=SEQ):
        flat = bb.emit(relax.op.reshape(m, relax.ShapeExpr([BATCH * SEQ, 1])))
        b = relax.op.multiply(relax.op.expand_dims(relax.op.arange(0, BATCH, 1, "int64"), [1, 2, 3]),
                              relax.op.astype(relax.op.shape_to_tensor(relax.ShapeExpr([stride])), "int64"))
        idx = bb.emit(relax.op.add(b, relax.op.expand_dims(relax.op.arange(0, SEQ, 1, "int64"), [0, 1, 2])))
        picked = bb.emit(relax.op.take(flat, idx, axis=0))  # [B, 1, 1, S, 1]
        return _additive(bb, bb.emit(relax.op.reshape(picked, relax.ShapeExpr([BATCH, 1, 1, SEQ]))))
    assert _prove(build) == (None, None)
    reason, _ = _prove(lambda bb, m: build(bb, m, stride=SEQ + 1))  # b·(S+1) + j: not m[b, j]
    assert "relax.take" in reason and "m[b, j]" in reason


def test_dynamo_gather_nd():
    """``where(gather_nd(bool(m), [b, j]) & True, 0, min)``, the indices behind the negative-index guard."""
    def build(bb, m):
        picked = bb.emit(relax.op.gather_nd(relax.op.astype(m, "bool"), _guarded(bb, _coords(bb))))
        return _where(bb, relax.op.logical_and(relax.const(True), picked))
    assert _prove(build) == (None, None)


def test_dynamo_gather_nd_of_the_query_position_is_refused():
    def build(bb, m):
        picked = bb.emit(relax.op.gather_nd(relax.op.astype(m, "bool"), _coords(bb, query_axis=True)))
        wide = bb.emit(relax.op.broadcast_to(picked, relax.ShapeExpr([BATCH, 1, SEQ, SEQ])))
        return _where(bb, wide)
    padding, key_only = _prove(build)
    assert padding is None and "off the key axis" in key_only


def test_dynamo_gather_nd_at_shifted_positions_is_refused():
    def build(bb, m):
        idx = bb.emit(relax.op.add(_coords(bb), relax.const(np.array([0, 1], np.int64), "int64")))  # m[b, j + 1]
        return _where(bb, bb.emit(relax.op.gather_nd(relax.op.astype(m, "bool"), idx)))
    reason, _ = _prove(build)
    assert "relax.gather_nd" in reason


def test_gather_at_the_identity():
    """``Gather(m, arange(S), axis=1)`` reads every key in order."""
    def build(bb, m):
        picked = bb.emit(relax.op.take(m, relax.op.arange(0, SEQ, 1, "int64"), axis=1))
        return _where(bb, relax.op.astype(_expand4(bb, picked), "bool"))
    assert _prove(build) == (None, None)


def test_gather_reversed_is_refused():
    def build(bb, m):
        rev = relax.op.subtract(relax.op.astype(relax.op.shape_to_tensor(relax.ShapeExpr([SEQ])), "int64"),
                                relax.op.add(relax.op.arange(0, SEQ, 1, "int64"), relax.const(1, "int64")))
        picked = bb.emit(relax.op.take(m, bb.emit(rev), axis=1))
        return _where(bb, relax.op.astype(_expand4(bb, picked), "bool"))
    reason, _ = _prove(build)
    assert "relax.take" in reason


def test_expand_to_every_head_and_query():
    """``Expand`` of the key mask to ``[B, H, S, S]`` before the arithmetic."""
    def build(bb, m):
        return _additive(bb, bb.emit(relax.op.broadcast_to(_expand4(bb, m), relax.ShapeExpr([BATCH, 4, SEQ, SEQ]))))
    assert _prove(build) == (None, None)


def test_masked_fill_as_where():
    """``scores.masked_fill(mask == 0, min)`` as ``where(equal(m, 0), min, 0)``."""
    def build(bb, m):
        return relax.op.where(relax.op.equal(_expand4(bb, m), relax.const(0, "int64")), relax.const(MIN),
                              relax.const(0.0))
    assert _prove(build) == (None, None)


def test_masked_fill_of_the_valid_tokens_is_refused():
    """``masked_fill(mask == 1, min)``: the padding is what stays visible."""
    def build(bb, m):
        return relax.op.where(relax.op.equal(_expand4(bb, m), relax.const(1, "int64")), relax.const(MIN),
                              relax.const(0.0))
    reason, _ = _prove(build)
    assert "does not hide the key" in reason


def test_boolean_mask():
    """A bool mask made additive: ``where(bool(m), 0, -inf)``; and ``logical_not`` of the padding flags."""
    assert _prove(lambda bb, m: _where(bb, relax.op.astype(_expand4(bb, m), "bool"))) == (None, None)
    pad = lambda bb, m: relax.op.logical_not(relax.op.astype(_expand4(bb, m), "bool"))  # noqa: E731
    assert _prove(lambda bb, m: relax.op.where(pad(bb, m), relax.const(-np.inf), relax.const(0.0))) == (None, None)


def test_boolean_mask_inverted_is_refused():
    reason, _ = _prove(lambda bb, m: relax.op.where(relax.op.astype(_expand4(bb, m), "bool"), relax.const(MIN),
                                                    relax.const(0.0)))
    assert "does not hide the key" in reason


def test_isnan_guard():
    """``where(isnan(bias), min, bias)`` around the additive mask (SDPA-era exports guard it)."""
    def build(bb, m):
        bias = bb.emit(_additive(bb, _expand4(bb, m)))
        return relax.op.where(relax.op.isnan(bias), relax.const(MIN), bias)
    assert _prove(build) == (None, None)


def test_isnan_guard_that_unmasks_is_refused():
    """A guard that zeroes the bias wherever it is not NaN: padding is no longer hidden."""
    def build(bb, m):
        bias = bb.emit(_additive(bb, _expand4(bb, m)))
        return relax.op.where(relax.op.isnan(bias), bias, relax.const(0.0))
    reason, _ = _prove(build)
    assert "does not hide the key" in reason


def test_causal_term_from_positions_hides_padding_but_is_not_key_only():
    """``where(m[b, j] & (j <= q), 0, min)``: padding is hidden whatever the causal term, which varies with the
    query: the attention keeps the scatter/gather around the padded kernel."""
    def build(bb, m):
        q = relax.op.expand_dims(relax.op.arange(0, SEQ, 1, "int64"), [1])
        k = relax.op.expand_dims(relax.op.arange(0, SEQ, 1, "int64"), [0])
        causal = bb.emit(relax.op.less_equal(k, q))  # [S, S]
        return _where(bb, relax.op.logical_and(relax.op.astype(_expand4(bb, m), "bool"), causal))
    padding, key_only = _prove(build)
    assert padding is None
    assert "not a key-only mask" in key_only and "relax.arange" in key_only


def test_mask_read_on_query_and_key_hides_padding_but_is_not_key_only():
    """DeBERTa's ``(1 - m[b, q] · m[b, j]) · min``: a padded key is hidden whatever ``m[b, q]`` is."""
    def build(bb, m):
        qk = relax.op.multiply(relax.op.expand_dims(m, [1, 3]), relax.op.expand_dims(m, [1, 2]))
        return _additive(bb, bb.emit(qk))
    padding, key_only = _prove(build)
    assert padding is None and "read off the key axis" in key_only


def test_mask_or_on_query_and_key_is_refused():
    """``m[b, q] | m[b, j]``: a valid query makes a padded key visible."""
    def build(bb, m):
        mb = relax.op.astype(m, "bool")
        return _where(bb, bb.emit(relax.op.logical_or(relax.op.expand_dims(mb, [1, 3]),
                                                      relax.op.expand_dims(mb, [1, 2]))))
    reason, _ = _prove(build)
    assert "does not hide the key" in reason


def test_mask_read_off_the_key_axis_only_twice_is_refused():
    """``m[b, q] & m[b, q]ᵀ``-like reads, neither on the key axis: nothing to keep."""
    def build(bb, m):
        mb = relax.op.astype(m, "bool")
        a = relax.op.expand_dims(mb, [1, 3])  # [B, 1, S, 1]
        b = relax.op.expand_dims(mb, [1, 2, 4])  # [B, 1, 1, S, 1]
        return relax.op.sum(_where(bb, bb.emit(relax.op.logical_and(a, b))), axis=[4])
    reason, _ = _prove(build)
    assert "different axes" in reason or "relax.sum" in reason


def test_unknown_op_on_the_mask_is_named():
    def build(bb, m):
        return _additive(bb, _expand4(bb, bb.emit(relax.op.cumsum(m, axis=1))))
    reason, _ = _prove(build)
    assert "relax.cumsum" in reason


@pytest.mark.parametrize("scale", [-1.0, 1e4])
def test_too_weak_or_positive_bias_is_refused(scale):
    reason, _ = _prove(lambda bb, m: relax.op.multiply(
        relax.op.subtract(relax.const(1.0), relax.op.astype(_expand4(bb, m), "float32")), relax.const(scale)))
    assert "does not hide the key" in reason
