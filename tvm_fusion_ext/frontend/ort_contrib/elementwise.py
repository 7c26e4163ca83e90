"""ONNX Runtime's activation and matmul contrib ops, written as the Relax ops the dense rule reads.

    Gelu(x)            gelu (erf)                        BiasGelu(x, b)   gelu(x + b)
    FastGelu(x[, b])   gelu_tanh(x [+ b])                QuickGelu(x)     x · sigmoid(alpha · x); silu when alpha = 1
    BiasAdd(x, b, s)   x + b + s                         FusedMatMul      alpha · op(A) · op(B), op a transpose of
                                                                          the last two axes when transA / transB

ONNX Runtime's optimizer writes ``QuickGelu`` with alpha 1 for a LLaMA MLP's SiLU, so that form stays ``silu`` and
the gated-MLP rule reads it. ``FastGelu`` is ONNX Runtime's tanh approximation, ``0.5·x·(1 + tanh(√(2/π)·(x +
0.044715·x³)))``, which is exactly Relax's ``gelu_tanh``. Refused: ``FusedMatMul``'s ``transBatchA``/``transBatchB``
(batch axes moved into the matrix axes) and transposes of a 1-D operand.
"""

from __future__ import annotations

from ..errors import Unsupported


def convert_gelu(bb, inputs, attr, outputs):
    from tvm import relax

    return relax.op.nn.gelu(inputs[0])


def convert_bias_gelu(bb, inputs, attr, outputs):
    from tvm import relax

    return relax.op.nn.gelu(relax.op.add(inputs[0], inputs[1]))


def convert_fast_gelu(bb, inputs, attr, outputs):
    from tvm import relax

    x = inputs[0]
    if len(inputs) > 1 and inputs[1] is not None:
        x = relax.op.add(x, inputs[1])
    return relax.op.nn.gelu_tanh(x)


def convert_quick_gelu(bb, inputs, attr, outputs):
    from tvm import relax

    x = bb.normalize(inputs[0])
    alpha = float(attr.get("alpha", 1.702))
    if alpha == 1.0:
        return relax.op.nn.silu(x)
    return relax.op.multiply(x, relax.op.sigmoid(relax.op.multiply(x, relax.const(alpha, str(x.ty.dtype)))))


def convert_bias_add(bb, inputs, attr, outputs):
    from tvm import relax

    return relax.op.add(relax.op.add(inputs[0], inputs[1]), inputs[2])


def convert_fused_matmul(bb, inputs, attr, outputs):
    from tvm import relax

    a, b = (bb.normalize(x) for x in inputs[:2])
    for key in ("transBatchA", "transBatchB"):
        if int(attr.get(key, 0)):
            raise Unsupported(f"{key}=1 (batch axes transposed into the matrix) is not supported")
    operands = []
    for x, key in ((a, "transA"), (b, "transB")):
        if int(attr.get(key, 0)):
            rank = len(x.ty.shape.values)
            if rank < 2:
                raise Unsupported(f"{key}=1 on a {rank}-D operand")
            x = relax.op.permute_dims(x, list(range(rank - 2)) + [rank - 1, rank - 2])
        operands.append(x)
    y = relax.op.matmul(*operands)
    alpha = float(attr.get("alpha", 1.0))
    if alpha != 1.0:
        y = relax.op.multiply(y, relax.const(alpha, str(a.ty.dtype)))
    return y
