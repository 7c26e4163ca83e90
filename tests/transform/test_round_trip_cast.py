"""DropRoundTripCast: ``astype(astype(x, wide), dtype of x)`` → ``x`` only where the middle type holds every value
of ``x``'s exactly. Torch's legacy export of a float16 model's eager attention puts float16 → float32 → float16
between the softmax and the second matmul; with the round trip gone the attention fuses. Narrowing round trips
(float32 → float16 → float32 rounds; int64 → int32 → int64 wraps) are kept."""

import numpy as np
import pytest
from tvm import relax

from tvm_fusion_ext.testing import build_module, fuse, fused_calls, run_before_after
from tvm_fusion_ext.transform import FuseMultiHeadAttention
from tvm_fusion_ext.transform.canonical.round_trip_cast import DropRoundTripCast, widens
from tvm_fusion_ext.transform.canonicalize import Canonicalize

B, H, S, D = 2, 2, 12, 8


def _eager_attention(middle="float32"):
    q, k, v = (relax.Var(n, relax.TensorType([B, H, S, D], "float16")) for n in "qkv")

    def build(bb):
        scores = bb.emit(relax.op.multiply(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2])),
                                           relax.const(D ** -0.5, "float16")))
        p = bb.emit(relax.op.nn.softmax(scores, axis=-1))
        p = bb.emit(relax.op.astype(bb.emit(relax.op.astype(p, middle)), "float16"))
        return relax.op.matmul(p, v)

    return build_module([q, k, v], build)


def _inputs():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((B, H, S, D)).astype("float16") for _ in range(3)]


def test_exact_round_trip_is_dropped_and_the_attention_fuses():
    mod = _eager_attention()
    fused, report = fuse(mod, Canonicalize(), FuseMultiHeadAttention())
    assert report.canonicalized.get("DropRoundTripCast") == 1, report.canonicalized
    assert report.fused["attention"] == 1, report.summary()
    assert fused_calls(fused) == {"fused_attention": 1}
    expected, actual = run_before_after(mod, fused, _inputs())
    np.testing.assert_allclose(actual.astype("float32"), expected.astype("float32"), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("source, middle", [("float32", "float16"), ("int64", "int32"), ("float16", "bfloat16"),
                                            ("int32", "float32")])
def test_a_round_trip_that_can_change_values_is_kept(source, middle):
    x = relax.Var("x", relax.TensorType([4, 6], source))
    mod = build_module([x], lambda bb: relax.op.astype(bb.emit(relax.op.astype(x, middle)), source))
    fused, report = fuse(mod, DropRoundTripCast())
    assert not widens(source, middle)
    assert report.canonicalized.get("DropRoundTripCast") is None
    assert fused["main"].script().count("R.astype") == 2


def test_the_inner_cast_stays_for_another_reader():
    x = relax.Var("x", relax.TensorType([4, 6], "float16"))

    def build(bb):
        wide = bb.emit(relax.op.astype(x, "float32"))
        back = bb.emit(relax.op.astype(wide, "float16"))
        return relax.Tuple([back, bb.emit(relax.op.add(wide, relax.const(1.0, "float32")))])

    mod = build_module([x], build)
    fused, report = fuse(mod, DropRoundTripCast())
    assert report.canonicalized.get("DropRoundTripCast") == 1
    data = [np.random.default_rng(1).standard_normal((4, 6)).astype("float16")]
    expected, actual = run_before_after(mod, fused, data)
    for e, a in zip(expected, actual):
        np.testing.assert_array_equal(a, e)
