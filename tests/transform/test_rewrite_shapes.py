"""The exact shape of each rewrite, pinned the way TVM's own pass tests do it:
``tvm.ir.assert_structural_equal(Pass()(Before), Expected)``.

``Before`` modules are TVMScript. ``Expected`` modules are TVMScript where the result is plain Relax. Where
it holds a fused operator, ``Expected`` is built with ``relax.BlockBuilder`` + ``tvm_fusion_ext.ops.call_op``:
the operator's PrimFunc written out in TVMScript would be a page of TIR that says nothing about the rewrite.
Constant weights (QKV) cannot be written inline in TVMScript, so that case builds both modules in Python.
Python-built modules are one ``main`` with one dataflow block (:func:`tvm_fusion_ext.testing.build_module`).
"""

import numpy as np
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_fusion_ext.ops import call_op
from tvm_fusion_ext.testing import build_module
from tvm_fusion_ext.transform import (Canonicalize, FuseBiasResidualLayerNorm, FuseMatmulBiasActivation,
                                      FuseMultiHeadAttention, FuseQKVProjection)


def _tensor(name, shape, dtype="float32"):
    return relax.Var(name, relax.TensorType(shape, dtype))


def test_erf_gelu_becomes_gelu():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4, 16), "float32")) -> R.Tensor((4, 16), "float32"):
            with R.dataflow():
                lv = R.divide(x, R.const(1.4142135381698608, "float32"))
                lv1 = R.erf(lv)
                lv2 = R.add(lv1, R.const(1.0, "float32"))
                lv3 = R.multiply(x, lv2)
                gv = R.multiply(lv3, R.const(0.5, "float32"))
                R.output(gv)
            return gv

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((4, 16), "float32")) -> R.Tensor((4, 16), "float32"):
            with R.dataflow():
                gv = R.nn.gelu(x)
                R.output(gv)
            return gv

    tvm.ir.assert_structural_equal(Canonicalize()(Before), Expected)


def test_dense_with_transposed_weight_bias_and_gelu():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 5, 12), "float32"), w: R.Tensor((7, 12), "float32"),
                 b: R.Tensor((1, 1, 7), "float32")) -> R.Tensor((2, 5, 7), "float32"):
            with R.dataflow():
                wt = R.permute_dims(w, axes=[1, 0])
                y = R.matmul(x, wt)
                z = R.add(b, y)
                gv = R.nn.gelu(z)
                R.output(gv)
            return gv

    # Expected: the transpose is absorbed (transpose_b), the [1, 1, N] bias is viewed as [N]
    x, w, b = _tensor("x", (2, 5, 12)), _tensor("w", (7, 12)), _tensor("b", (1, 1, 7))

    def expected(bb):
        bias = bb.emit(relax.op.reshape(b, [7]))
        return call_op(bb, "fused_dense", {"x": x, "w": w, "bias": bias}, {"act": "gelu", "transpose_b": True})

    tvm.ir.assert_structural_equal(FuseMatmulBiasActivation()(Before), build_module([x, w, b], expected))


def test_bias_residual_layernorm():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 6, 16), "float32"), b: R.Tensor((16,), "float32"),
                 r: R.Tensor((2, 6, 16), "float32"), g: R.Tensor((16,), "float32"),
                 be: R.Tensor((16,), "float32")) -> R.Tensor((2, 6, 16), "float32"):
            with R.dataflow():
                lv = R.add(x, b)
                lv1 = R.add(r, lv)
                gv = R.nn.layer_norm(lv1, g, be, axes=[-1], epsilon=1e-5)
                R.output(gv)
            return gv

    x, b, r = _tensor("x", (2, 6, 16)), _tensor("b", (16,)), _tensor("r", (2, 6, 16))
    g, be = _tensor("g", (16,)), _tensor("be", (16,))
    expected = build_module([x, b, r, g, be], lambda bb: call_op(
        bb, "fused_layernorm", {"x": x, "residual": r, "bias": b, "gamma": g, "beta": be}, {"eps": 1e-5}))

    tvm.ir.assert_structural_equal(FuseBiasResidualLayerNorm()(Before), expected)


def test_qkv_projections_become_one_matmul_and_a_split():
    rng = np.random.default_rng(0)
    wq, wk, wv = (rng.standard_normal((8, n)).astype("float32") for n in (4, 4, 2))
    bq, bk = (rng.standard_normal((4,)).astype("float32") for _ in range(2))

    x = _tensor("x", (3, 8))

    def before(bb):
        q = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, relax.const(wq))), relax.const(bq)))
        # a Gemm(transB=1) import: the weight is stored [N, K] and transposed in the graph
        wk_t = bb.emit(relax.op.permute_dims(relax.const(np.ascontiguousarray(wk.T)), [1, 0]))
        k = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, wk_t)), relax.const(bk)))
        v = bb.emit(relax.op.matmul(x, relax.const(wv)))  # no bias
        return relax.Tuple([q, k, v])

    def expected(bb):
        y = bb.emit(relax.op.matmul(x, relax.const(np.concatenate([wq, wk, wv], axis=1))))
        # the missing bias of v is a run of zeros in the merged bias
        y = bb.emit(relax.op.add(y, relax.const(np.concatenate([bq, bk, np.zeros(2, "float32")]))))
        parts = bb.emit(relax.op.split(y, [4, 8], axis=-1))
        return relax.Tuple([bb.emit(relax.TupleGetItem(parts, i)) for i in range(3)])

    tvm.ir.assert_structural_equal(FuseQKVProjection()(build_module([x], before)), build_module([x], expected))


def test_attention_absorbs_head_split_and_merge():
    @I.ir_module
    class Before:
        @R.function
        def main(xq: R.Tensor((2, 5, 12), "float32"), xk: R.Tensor((2, 7, 12), "float32"),
                 xv: R.Tensor((2, 7, 12), "float32"),
                 keep: R.Tensor((2, 1, 1, 7), "bool")) -> R.Tensor((2, 5, 12), "float32"):
            with R.dataflow():
                q4 = R.reshape(xq, R.shape([2, 5, 3, 4]))
                q = R.permute_dims(q4, axes=[0, 2, 1, 3])
                k4 = R.reshape(xk, R.shape([2, 7, 3, 4]))
                kt = R.permute_dims(k4, axes=[0, 2, 3, 1])
                v4 = R.reshape(xv, R.shape([2, 7, 3, 4]))
                v = R.permute_dims(v4, axes=[0, 2, 1, 3])
                s = R.matmul(q, kt)
                s1 = R.divide(s, R.const(2.0, "float32"))
                wide = R.broadcast_to(keep, R.shape([2, 1, 5, 7]))
                mask = R.where(wide, R.const(0.0, "float32"), R.const(-1e9, "float32"))
                s2 = R.add(s1, mask)
                p = R.nn.softmax(s2, axis=-1)
                o = R.matmul(p, v)
                o1 = R.permute_dims(o, axes=[0, 2, 1, 3])
                gv = R.reshape(o1, R.shape([2, 5, 12]))
                R.output(gv)
            return gv

    # Expected: the operator reads the head-split views in BSHD (the permutes go), the key-padding mask at
    # [B, 1, 1, T] (its broadcast goes), writes BSHD, and the head merge is a reshape of that
    xq, xk, xv = _tensor("xq", (2, 5, 12)), _tensor("xk", (2, 7, 12)), _tensor("xv", (2, 7, 12))
    keep = _tensor("keep", (2, 1, 1, 7), "bool")

    def expected(bb):
        q4 = bb.emit(relax.op.reshape(xq, [2, 5, 3, 4]))
        k4 = bb.emit(relax.op.reshape(xk, [2, 7, 3, 4]))
        v4 = bb.emit(relax.op.reshape(xv, [2, 7, 3, 4]))
        mask = bb.emit(relax.op.where(keep, relax.const(0.0, "float32"), relax.const(-1e9, "float32")))
        attn = bb.emit(call_op(bb, "fused_attention", {"q": q4, "k": k4, "v": v4, "mask": mask},
                               {"scale": 0.5, "causal": False, "q_layout": "BSHD", "k_layout": "BSHD",
                                "v_layout": "BSHD", "out_layout": "BSHD"}))
        return relax.op.reshape(attn, [2, 5, 12])

    tvm.ir.assert_structural_equal(FuseMultiHeadAttention()(Before), build_module([xq, xk, xv, keep], expected))
