"""FoldScalarConstants: arithmetic on one-element constants becomes the constant it computes, so that
``nn.MultiheadAttention``'s run-time scale (``sqrt(1 / sqrt(d))``, multiplied into q and k) is one the attention
rule reads; a scalar computed from an input, or an integer (a size), is left alone."""

import numpy as np
from tvm import relax

from tvm_fusion_ext.testing import build_module, fuse, fused_calls, random_inputs, run_before_after
from tvm_fusion_ext.transform.canonical.scalar_constants import FoldScalarConstants
from tvm_fusion_ext.transform.graph import const_value

B, H, S, D = 2, 4, 6, 16


def _c(v, dtype="float32"):
    return relax.const(np.asarray(v, dtype))


def mha_attention(scale_from_input=False):
    """torch's ``nn.MultiheadAttention`` core on [B, H, S, D] heads: q and k each times ``sqrt(1 / sqrt(D))``,
    computed from one-element constants (or, ``scale_from_input``, from a run-time scalar)."""
    q, k, v = (relax.Var(n, relax.TensorType((B, H, S, D), "float32")) for n in "qkv")
    t = relax.Var("t", relax.TensorType((1,), "float32"))

    def body(bb):
        if scale_from_input:
            scale = bb.emit(relax.op.sqrt(t))
        else:
            root = bb.emit(relax.op.sqrt(_c([float(D)])))
            scale = bb.emit(relax.op.sqrt(bb.emit(relax.op.divide(_c([1.0]), root))))
        qs = bb.emit(relax.op.multiply(q, scale))
        ks = bb.emit(relax.op.multiply(bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2])), scale))
        p = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.matmul(qs, ks)), axis=-1))
        return bb.emit(relax.op.matmul(p, v))

    return build_module([q, k, v, t], body)


def _inputs(mod):
    inputs = random_inputs(mod, seed=3)
    inputs[3] = np.abs(inputs[3]) + 0.1
    return inputs


def test_a_run_time_scale_of_constants_folds_and_the_attention_fuses():
    mod = mha_attention()
    out, report = fuse(mod)
    assert report.count("FoldScalarConstants") >= 1
    assert report.fused["attention"] == 1, report.summary()
    assert fused_calls(out).get("fused_attention") == 1
    expected, actual = run_before_after(mod, out, _inputs(mod))
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_the_folded_value_is_what_the_graph_computes():
    mod = mha_attention()
    out, _ = fuse(mod, FoldScalarConstants())
    bound = {b.var: b.value for b in out["main"].body.blocks[0].bindings}
    scales = [bound.get(a, a) for b in bound.values()
              if isinstance(b, relax.Call) and b.op.name == "relax.multiply" for a in b.args]
    values = {float(const_value(x).reshape(-1)[0]) for x in scales if const_value(x) is not None}
    want = np.sqrt(np.float32(1.0) / np.sqrt(np.float32(D)))
    assert values == {float(want)}, values


def test_a_scalar_computed_from_an_input_is_not_folded():
    mod = mha_attention(scale_from_input=True)
    out, report = fuse(mod, FoldScalarConstants())
    assert report.count("FoldScalarConstants") == 0
    assert out.same_as(mod) or out["main"].same_as(mod["main"])
    # the split scale is not merged (with its reason) ...
    fused, full = fuse(mod)
    reasons = [e.detail for e in full.refused if e.rule == "MergeSplitAttentionScale"]
    assert "the factor on matmul operand a is not a nonzero scalar constant" in reasons, reasons
    # ... and the attention fuses on the scaled operands as the graph computes them (the scaled Kᵀ through a
    # transposed copy; refused until 2026-11-25)
    assert full.fused["attention"] == 1, full.summary()
    inputs = [np.random.default_rng(0).standard_normal((B, H, S, D)).astype("float32") for _ in range(3)]
    expected, actual = run_before_after(mod, fused, inputs + [np.array([0.3], "float32")])
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
