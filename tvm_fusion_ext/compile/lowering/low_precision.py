"""float16/bfloat16 matmuls, convolutions and summing reductions left to TVM's own lowering accumulate in
float32, as ours do.

TVM legalizes ``matmul(a, b)`` and ``conv2d(x, w)`` of float16 operands into a ``te.sum`` in float16 unless the
call names a wider ``out_dtype``: every partial sum is rounded to 11 bits. Over a ViT's patch embedding
(K = 192) and the matmuls no rule fused, a tiny fp16 ViT drifted 0.014 from torch's float32 answer where ONNX
Runtime, which accumulates fp16 GEMMs in float32 on CPU and GPU, drifted 0.0024. The package's own operators
already accumulate in float32 (``ops/dense.py``, ``ops/attention.py``, ...). This pass gives the stock ones the
same contract: ``op(..., out_dtype="float32")`` then a cast back to the operands' dtype, which ``FuseOps`` folds
into the kernel's epilogue (one kernel, as before, its output still float16).

Reductions that sum (``sum``, ``mean``, ``variance``, ``std``, ``softmax``, ``log_softmax``) likewise: TVM sums
them in the input's dtype, so a float16 softmax over 4,096 keys was 26 % off (each exp added to a float16 running
sum near 2,048, whose step is 2) and a mean 0.4 %; they now run on the input cast to float32 and cast back. The
norms (``layer_norm``, ``rms_norm``) already computed in float32.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .mutation import mutate_functions

LOW_PRECISION = ("float16", "bfloat16")
_WIDENED = {"relax.matmul", "relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d",
            "relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose"}
# reductions that sum (max/min are exact in any dtype): computed on the input cast to float32
_SUMMING = {"relax.sum", "relax.mean", "relax.variance", "relax.std", "relax.nn.softmax", "relax.nn.log_softmax"}


@relax.expr_functor.mutator
class _Widen(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.changed = 0

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        if call.op.name in _SUMMING:
            return self._summing(call)
        if call.op.name not in _WIDENED:
            return call
        dtype = str(call.ty.dtype) if isinstance(call.ty, relax.TensorType) else ""
        operands = {str(a.ty.dtype) for a in call.args[:2] if isinstance(a.ty, relax.TensorType)}
        if dtype not in LOW_PRECISION or operands != {dtype}:
            return call  # float32 already, mixed operands, or an explicit wider out_dtype
        wide = _rebuild(call)
        if wide is None:
            return call
        self.changed += 1
        return relax.op.astype(self.builder_.emit(wide), dtype)


    def _summing(self, call):
        dtype = str(call.args[0].ty.dtype) if isinstance(call.args[0].ty, relax.TensorType) else ""
        if dtype not in LOW_PRECISION:
            return call
        wide = self.builder_.emit(relax.op.astype(call.args[0], "float32"))
        self.changed += 1
        return relax.op.astype(self.builder_.emit(relax.Call(call.op, [wide, *call.args[1:]], call.attrs,
                                                             call.ty_args)), dtype)


def _ints(values):
    return [int(v) for v in values]


def _rebuild(call: relax.Call):
    """The same call with ``out_dtype="float32"``, or None when its op takes no out_dtype."""
    name, (x, w), at = call.op.name, call.args[:2], call.attrs
    if name == "relax.matmul":
        return relax.op.matmul(x, w, out_dtype="float32")
    common = dict(strides=_ints(at.strides), padding=_ints(at.padding), dilation=_ints(at.dilation),
                  groups=int(at.groups), data_layout=str(at.data_layout), kernel_layout=str(at.kernel_layout),
                  out_layout=str(at.out_layout), out_dtype="float32")
    if name.endswith("_transpose"):
        common["output_padding"] = _ints(at.output_padding)
    fn = {"relax.nn.conv1d": relax.op.nn.conv1d, "relax.nn.conv2d": relax.op.nn.conv2d,
          "relax.nn.conv3d": relax.op.nn.conv3d, "relax.nn.conv1d_transpose": relax.op.nn.conv1d_transpose,
          "relax.nn.conv2d_transpose": relax.op.nn.conv2d_transpose}[name]
    return fn(x, w, **common)


def AccumulateInFloat32() -> tvm.transform.Pass:  # noqa: N802
    """Stock float16/bfloat16 matmuls, convolutions and summing reductions accumulate in float32 (module
    docstring)."""

    @tvm.transform.module_pass(opt_level=0, name="tfx.AccumulateInFloat32")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return mutate_functions(mod, _Widen(mod))

    return _pass
