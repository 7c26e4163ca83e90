"""The precision a model's dense kernels compute in: ``fp32`` (default), ``bf16`` or ``int8``.

A property of one compilation (``compile_model(..., precision=)``), recorded in its :class:`PrecisionReport`, the
fusion report and the artifact manifest. Only the weight-streaming operators change: every ``fused_dense`` (the
fused QKV projection included: it is one ``fused_dense`` on the concatenated weights) and ``fused_gated_dense``
whose weight is a compile-time constant. Norms, softmax, attention's matmuls, residual adds and the model's
outputs stay fp32.

``bf16``: the weight is stored as bfloat16 (half the bytes streamed per call) and the activation entering the kernel
is rounded to bfloat16 (:func:`round_to_bf16`, an elementwise kernel in front of the call; FuseOps joins it to an
elementwise producer, not to a fused layer norm or dense: MiniLM at 8 × 128 spends ~6 % of its call in them). Where
the target has AVX512_BF16 (Zen 4, Cooper Lake, Sapphire Rapids and later) the dense (the fused QKV projection
included; the gated dense as one dense over its gate's and up projection's columns side by side, then
``act(gate) * up``, as int8 below) multiplies with ``vdpbf16ps``: the activation is stored as bfloat16 bit patterns
(:func:`round_to_bf16_bits`, uint16: a pair of k is one 32-bit broadcast), the weight packed at compile time in
k-pairs × 16 columns (``dot_panels``, ops/dense.py), and each instruction adds 16 columns' pair products into fp32
accumulators (schedules/cpu/dot_intrin.py). Elsewhere the kernels (the gated dense's own included) widen each
weight vector in registers (bf16 → fp32 is a 16-bit shift: ``vpmovzxwd`` + ``vpslld`` on AVX2) and accumulates with
fp32 FMAs. The product of two bfloat16 values is exact in fp32 in both, and both round each addition to the
accumulator to nearest even; they differ in order and denormals: ``vdpbf16ps`` adds a pair's odd k before its even
one and treats denormal inputs and results as zero, the FMA loop adds in k order and keeps denormals, so results
agree to a few ulps of the accumulator (denormal-sized values aside). TVM 0.27 cannot type the instruction's
``<32 x bfloat>`` operands (its BF16 legalisation turns bfloat16 values into float32 or uint16, and LLVM rejects the
call), so the bitcast is a few lines of LLVM IR linked into the module (schedules/cpu/dot_intrin.py,
``dpbf16ps_wrapper``). AMX is not used.

``int8``: dynamic quantisation (:mod:`..ops.dense_int8`): weights int8 symmetric per output channel, activations
uint8 asymmetric per row (token) (the ONNX Runtime ``quantize_dynamic`` scheme, whose activations are
quantised per tensor: per row is finer), quantised at run time by one fused kernel in front of the dense
(:mod:`..ops.quantize_rows`: one pass for the row's range, one to quantise; activation smoothing's per-channel
multiply folded into its read; on CUDA, stock kernels), int32 accumulation, the zero-point correction, scales,
bias and activation in the dense kernel's epilogue. The gated dense (SwiGLU, GeGLU) is the same int8 dense over its
gate's and up projection's columns side by side (K, 2N; they share x, so one quantisation and one smoothing
vector), followed by ``act(gate) * up``, an elementwise kernel on its (rows, 2N) output
(:func:`..ops.gated_dense.gate_product`): at decode's few rows that output is a few tens of KB, and the kernel is
about 1 % of a LLaMA-1024 decode step (docs/precision.md), so the product is not in the dense's epilogue. The
micro-kernel multiplies with the target's dot-product instruction (schedules/cpu/dot_intrin.py), on weights packed
k-grouped at compile time: ``vpdpbusd`` (u8 × s8 quads) with AVX512-VNNI or AVX-VNNI, ``vpmaddwd`` (int16
pairs; the activations are stored as int16 for it) on AVX2. Every form is exact in int32, so the results are
those of the scalar loop bit for bit; without AVX2 the scalar loop runs.

CUDA targets take both. ``int8``: the weight is stored (N, K) (``transpose_b``), the layout of the tensor-core
path (:mod:`..schedules.cuda.tensorcore_int8`: mma.sync m16n8k32 u8 × s8 → s32 where M and N are multiples of 16
and K of 32; the SIMT dense otherwise), and the quantisation kernels in front of it are stock reductions and
elementwise kernels that dlight binds to threads. ``bf16``: the activation is cast to a bfloat16 tensor (the same
round-to-nearest-even) and the dense is the fp16/bf16 tensor-core one (m16n8k16, fp32 accumulation) with an fp32
output. The gated dense is, in both, the CPU's form: one such dense over its gate's and up projection's columns
side by side (int8: the (2N, K) transposed weight; bf16: (K, 2N)), on tensor cores where its rows and 2N tile, then
``act(gate) * up``, an elementwise kernel dlight binds to threads (in a bf16 model FuseOps joins it to the cast in
front of the down projection).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import tvm
from tvm import relax

from ..errors import InputError
from ..ops.gated_dense import gate_product, side_by_side
from ..ops.registry import call_op, params_of
from .lowering.operator_calls import bound_constant, operator_call

PRECISIONS = ("fp32", "bf16", "int8")
#: the operators whose constant weights change precision
LOW_PRECISION_OPS = ("fused_dense", "fused_gated_dense")
#: precisions each non-CPU target family compiles (CPU targets: all of :data:`PRECISIONS`)
GPU_PRECISIONS = {"cuda": ("fp32", "bf16", "int8")}
#: LLVM features the kernels of each precision are built on, recorded when the target has them. int8's dense
#: kernel multiplies with the target's dot-product instruction (schedules/cpu/dot_intrin.py, tensorized: LLVM
#: does not form these from a loop nest): ``vpdpbusd`` where the target has AVX512-VNNI (512-bit) or AVX-VNNI
#: (256-bit), else AVX2's ``vpmaddwd``; only the one it uses is recorded. bf16's dense multiplies with
#: ``vdpbf16ps`` where the target has AVX512_BF16 (recorded as ``avx512bf16``), else it widens its weights in
#: registers and multiplies with fp32 FMAs. AMX is not used.
PRECISION_FEATURES = {
    "fp32": ("avx2", "fma", "avx512f"),
    "bf16": ("avx2", "fma", "avx512f", "avx512bf16"),
    "int8": ("avx2", "avx512f", "avx512bw", "avx512vnni", "avxvnni"),
}
#: features recorded only when the precision's kernel uses them (the target may have several)
DOT_PRODUCT_FEATURES = ("avx512vnni", "avxvnni", "avx512bf16")


def _row_params(params: dict) -> dict:
    """The gated dense's parameters its side-by-side dense keeps: how rows known at run time are padded."""
    return {k: v for k, v in params.items() if k in ("row_block", "row_clamp")}


def check_precision(precision: Optional[str]) -> str:
    """``precision`` if known (None means fp32), else one line naming the known ones."""
    precision = "fp32" if precision is None else str(precision)
    if precision not in PRECISIONS:
        raise InputError(f"unknown precision '{precision}' (known: {', '.join(PRECISIONS)})")
    return precision


@dataclass
class PrecisionReport:
    """What a compilation's precision changed, and (once measured) its accuracy against fp32."""

    precision: str = "fp32"
    #: operator → calls whose weights were converted
    converted: Dict[str, int] = field(default_factory=dict)
    #: operator calls left in fp32 and why (a run-time weight, a non-fp32 input)
    kept: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    #: the target's LLVM features the kernels of this precision can use
    features: List[str] = field(default_factory=list)
    #: :func:`~tvm_fusion_ext.compile.accuracy.measure` result, when measured
    accuracy: Optional[dict] = None

    @property
    def kernels(self) -> int:
        return sum(self.converted.values())

    def to_dict(self) -> dict:
        out = {"precision": self.precision, "converted": dict(self.converted), "kept_fp32": list(self.kept),
               "notes": list(self.notes), "features": list(self.features)}
        if self.accuracy is not None:
            out["accuracy"] = self.accuracy
        return out

    def summary(self) -> str:
        lines = [f"Precision: {self.precision}"]
        if self.precision != "fp32":
            done = ", ".join(f"{k} {v}" for k, v in self.converted.items()) or "none"
            lines.append(f"  weights in {self.precision}: {done}")
            if self.features:
                lines.append(f"  CPU features used: {', '.join(self.features)}")
        lines += [f"  note: {n}" for n in self.notes]
        if self.accuracy is not None:
            from .accuracy import describe

            lines += ["  " + line for line in describe(self.accuracy).splitlines()]
        return "\n".join(lines)


def target_features(target: tvm.target.Target, precision: str) -> List[str]:
    """The features of :data:`PRECISION_FEATURES` that ``target`` enables (CPU targets; none on CUDA)."""
    from tvm.target import codegen

    from ..targets import TargetInfo

    if not TargetInfo.of(target).is_cpu or precision == "fp32":
        return []
    have = {str(f) for f in codegen.llvm_get_cpu_features(target)}
    used = set()
    if precision == "int8":
        from ..schedules.cpu.dot_intrin import int8_dot_kernel

        kernel = int8_dot_kernel(target)
        used = set(kernel.features) if kernel is not None else set()
    if precision == "bf16":
        from ..schedules.cpu.dot_intrin import bf16_dot_kernel

        kernel = bf16_dot_kernel(target)
        used = set(kernel.features) if kernel is not None else set()
    return [f for f in PRECISION_FEATURES[precision] if f in have and (f not in DOT_PRODUCT_FEATURES or f in used)]


@relax.expr_functor.mutator
class _LowerPrecision(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, precision: str, report: PrecisionReport, ranges=None,
                 for_cuda: bool = False, x_dtype: str = "uint8", bf16_dot: bool = False):
        super().__init__(mod)
        self.bf16_dot = bf16_dot  # the target's dense multiplies bf16 pairs (vdpbf16ps): bit-pattern operands
        self.mod = mod
        self.x_dtype = x_dtype
        self.precision = precision
        self.for_cuda = for_cuda
        self.report = report
        self.ranges = ranges  # int8's activation smoothing (:mod:`.calibration`), when calibrated
        self.changed = 0
        self.smoothed = 0

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        found = operator_call(self.mod, call)
        if found is None or found[0] not in LOW_PRECISION_OPS:
            return call
        op, func, inputs = found
        params = params_of(func)
        w = bound_constant(self, inputs["w"])
        x_dtype = str(inputs["x"].ty.dtype)
        if w is None or w.dtype != np.float32 or x_dtype != "float32":
            why = "a run-time weight" if w is None else f"{x_dtype} input" if x_dtype != "float32" else "fp32 weight"
            self.report.kept.append(f"{op}: {why}")
            return call
        if params.get("w_layout", "plain") != "plain":
            self.report.kept.append(f"{op}: weight already packed")
            return call
        if self.precision == "bf16":
            new = self._bf16(op, inputs, params, w)
        elif op == "fused_dense":
            new = self._int8(inputs, params, w)
        else:
            new = self._int8_gated(inputs, params, w)
        if new is None:
            return call
        self.changed += 1
        self.report.converted[op] = self.report.converted.get(op, 0) + 1
        return new

    def _bf16(self, op, inputs, params, w):
        import ml_dtypes

        if self.for_cuda and op == "fused_gated_dense":
            # the pair as one bf16 tensor-core dense over the gate's and up projection's columns side by side
            # (K, 2N), then act(gate) * up (as int8 does it, see _int8_gated)
            x = self.builder_.emit(relax.op.astype(inputs["x"], "bfloat16"))
            dense = self.builder_.emit(call_op(
                self.builder_, "fused_dense",
                {"x": x, "w": relax.const(side_by_side(w).astype(ml_dtypes.bfloat16)),
                 "bias": self._side_by_side_bias(inputs)},
                {**_row_params(params), "out_dtype": "float32"}))
            return self._gate_product(dense, params)
        elif self.for_cuda:
            # a bf16 tensor (the same round-to-nearest-even): the tensor-core dense's input; fp32 accumulation
            # and output as on the CPU
            x = self.builder_.emit(relax.op.astype(inputs["x"], "bfloat16"))
            params = dict(params, out_dtype="float32")
        elif self.bf16_dot and op == "fused_gated_dense":
            # the pair as one vdpbf16ps dense over the gate's and up projection's columns side by side, then
            # act(gate) * up (as int8 does it, see _int8_gated)
            x = self.builder_.emit_te(round_to_bf16_bits, inputs["x"], primfunc_name_hint="round_to_bf16_bits")
            bits = relax.const(side_by_side(w).astype(ml_dtypes.bfloat16).view(np.uint16))
            dense = self.builder_.emit(call_op(self.builder_, "fused_dense",
                                               {"x": x, "w": bits, "bias": self._side_by_side_bias(inputs)},
                                               _row_params(params)))
            return self._gate_product(dense, params)
        elif self.bf16_dot and op == "fused_dense":
            # the operands of vdpbf16ps: bfloat16 bit patterns (uint16), the weight (K, N); the CPU template packs
            # it in k-pairs (schedules/cpu/dense.py)
            x = self.builder_.emit_te(round_to_bf16_bits, inputs["x"], primfunc_name_hint="round_to_bf16_bits")
            w = w.T if bool(params.get("transpose_b", False)) else w
            params = dict(params, transpose_b=False) if "transpose_b" in params else params
            given = dict(inputs, x=x, w=relax.const(np.ascontiguousarray(w).astype(ml_dtypes.bfloat16)
                                                    .view(np.uint16)))
            return call_op(self.builder_, op, given, params)
        else:
            x = self.builder_.emit_te(round_to_bf16, inputs["x"], primfunc_name_hint="round_to_bf16")
        given = dict(inputs, x=x, w=relax.const(w.astype(ml_dtypes.bfloat16)))
        return call_op(self.builder_, op, given, params)

    def _int8_gated(self, inputs, params, w):
        """The gated pair as one int8 dense over the gate's and the up projection's columns side by side (K, 2N)
        (one activation quantisation, one smoothing vector: they share x), then ``act(gate) * up``, an elementwise
        kernel on its (rows, 2N) output (ops/gated_dense.py :func:`gate_product`)."""
        pair = _row_params(params)
        dense = self.builder_.emit(self._int8(dict(inputs, bias=self._side_by_side_bias(inputs)), pair,
                                              side_by_side(w)))
        return self._gate_product(dense, params)

    def _side_by_side_bias(self, inputs):
        """The gated dense's (N, 2) bias as the (2N,) bias of its side-by-side dense: the gate's, then the up's."""
        bias = inputs.get("bias")
        if bias is None:
            return None
        value = bound_constant(self, bias)
        if value is not None:
            return relax.const(side_by_side(value))
        return self.builder_.emit(relax.op.reshape(self.builder_.emit(relax.op.permute_dims(bias, [1, 0])), [-1]))

    def _gate_product(self, dense, params):
        """``act(gate) * up`` on the side-by-side dense's (rows, 2N) output."""
        return self.builder_.call_te(gate_product, dense, params.get("act", "silu"),
                                     params.get("out_dtype") or "float32", primfunc_name_hint="gate_product")

    def _int8(self, inputs, params, w):
        from ..ops.dense_int8 import quantize_weight
        from .calibration import smoothing_factors, weight_key

        w = w.T if bool(params.get("transpose_b", False)) else w  # (K, N)
        x, smooth = inputs["x"], None
        if self.ranges is not None:
            s = smoothing_factors(self.ranges.get(weight_key(w)), w)
            if not np.all(s == 1.0):
                # (x / s) @ (s w): the outlier channels' range moves into the per-channel weight scales
                smooth = relax.const((1.0 / s).astype(np.float32))
                w = w * s[:, None]
                self.smoothed += 1
        wq, w_scale, w_sum = quantize_weight(w)  # (K, N) int8, (N,), (N,)
        # CPU: one fused kernel (the smoothing multiply folded into its read); CUDA: stock kernels dlight binds
        xq, x_scale, x_zero = quantize_rows(self.builder_, x, self.x_dtype, smooth=smooth, fused=not self.for_cuda)
        given = {"x": xq, "x_scale": x_scale, "x_zero": x_zero,
                 "w": relax.const(np.ascontiguousarray(wq.T) if self.for_cuda else wq),
                 "w_scale": relax.const(w_scale), "w_sum": relax.const(w_sum), "bias": inputs.get("bias")}
        kept = {k: v for k, v in params.items() if k in ("act", "out_dtype", "row_block", "row_clamp")}
        if self.for_cuda:
            kept["transpose_b"] = True
        return call_op(self.builder_, "fused_dense_int8", given, kept)


def round_to_bf16(x):
    """TE: float32 values rounded to the nearest bfloat16 (ties to even), kept in float32.

    Bit arithmetic, not ``astype``: TVM folds ``float32(bfloat16(x))`` back to ``x`` (its bf16 legalisation
    computes in float32 and rounds only where a bf16 buffer is stored), so the stock cast pair rounded nothing.
    Infinities stay; a NaN may become an infinity (no model feeds one to a dense layer on purpose)."""
    from tvm import te, tirx

    def rounded(*idx):
        u = tirx.reinterpret("uint32", x(*idx))
        lsb = (u >> tirx.const(16, "uint32")) & tirx.const(1, "uint32")
        u = (u + tirx.const(0x7FFF, "uint32") + lsb) & tirx.const(0xFFFF0000, "uint32")
        return tirx.reinterpret("float32", u)

    return te.compute(x.shape, rounded, name="round_to_bf16")


def round_to_bf16_bits(x):
    """TE: float32 values rounded to the nearest bfloat16 (ties to even, as :func:`round_to_bf16`), as their bit
    patterns (uint16): the activation operand of the ``vdpbf16ps`` dense (bfloat16 values themselves would go
    through TVM's bf16 legalisation, see the module docstring)."""
    from tvm import te, tirx

    def rounded(*idx):
        u = tirx.reinterpret("uint32", x(*idx))
        lsb = (u >> tirx.const(16, "uint32")) & tirx.const(1, "uint32")
        return ((u + tirx.const(0x7FFF, "uint32") + lsb) >> tirx.const(16, "uint32")).astype("uint16")

    return te.compute(x.shape, rounded, name="round_to_bf16_bits")


def quantize_rows(bb: relax.BlockBuilder, x: relax.Expr, dtype: str = "uint8", smooth: Optional[relax.Expr] = None,
                  fused: bool = False):
    """Per-row (last axis) asymmetric uint8 quantisation, ONNX ``DynamicQuantizeLinear``'s arithmetic per row:
    the range always holds 0 (so 0 is exact), scale = range / 255, zero point = round(-min / scale) clipped to
    [0, 255], q = clip(round(x / scale) + zero point). Returns (q uint8, scale float32, zero point int32), the
    last two of shape (..., 1). ``dtype`` int16: the same values, stored in the type AVX2's ``vpmaddwd`` kernel
    multiplies (schedules/cpu/dot_intrin.py). ``smooth`` (K,): activation smoothing's ``1 / s``, multiplied into
    ``x`` first.

    ``fused``: one ``fused_quantize_rows`` kernel (:mod:`..ops.quantize_rows`, the CPU path: one pass for the
    range, one to quantise, ``smooth`` applied as it reads), the same values bit for bit. Otherwise stock Relax
    ops (five or six kernels after FuseOps; what GPU schedules bind to threads)."""
    if fused:
        out = bb.emit(call_op(bb, "fused_quantize_rows", {"x": x, "smooth": smooth}, {"dtype": dtype}))
        return tuple(bb.emit(relax.TupleGetItem(out, i)) for i in range(3))
    if smooth is not None:
        x = bb.emit(relax.op.multiply(x, smooth))
    f32 = lambda v: relax.const(v, "float32")  # noqa: E731
    lo = bb.emit(relax.op.minimum(relax.op.min(x, axis=-1, keepdims=True), f32(0.0)))
    hi = bb.emit(relax.op.maximum(relax.op.max(x, axis=-1, keepdims=True), f32(0.0)))
    span = bb.emit(relax.op.divide(relax.op.subtract(hi, lo), f32(255.0)))
    scale = bb.emit(relax.op.where(relax.op.equal(span, f32(0.0)), f32(1.0), span))
    zero = bb.emit(relax.op.clip(relax.op.round(relax.op.divide(relax.op.negative(lo), scale)), 0, 255))
    q = bb.emit(relax.op.astype(relax.op.clip(relax.op.add(relax.op.round(relax.op.divide(x, scale)), zero),
                                              0, 255), dtype))
    return q, scale, bb.emit(relax.op.astype(zero, "int32"))


def LowerPrecision(precision: str, report: Optional[PrecisionReport] = None,  # noqa: N802
                   ranges: Optional[dict] = None, for_cuda: bool = False,
                   target: Optional[tvm.target.Target] = None) -> tvm.transform.Pass:
    """Rewrite the constant-weight dense operators of every function to ``precision`` (module docstring);
    what changed goes to ``report``. ``fp32``: nothing. ``ranges``: int8's calibrated activation ranges
    (:func:`~.calibration.dense_input_ranges`), which turn on activation smoothing. ``for_cuda``: the operands as
    the CUDA tensor-core kernels read them: int8 weights stored (N, K); bf16 activations cast to a bfloat16 tensor
    (fp32 output). ``target`` (CPU): int8 activations are stored in the type its dot-product kernel reads
    (:func:`int8_activation_dtype`)."""
    precision = check_precision(precision)
    report = report if report is not None else PrecisionReport(precision)

    @tvm.transform.module_pass(opt_level=0, name="tfx.LowerPrecision")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if precision == "fp32":
            return mod
        x_dtype = "uint8" if for_cuda else int8_activation_dtype(target)
        mutator = _LowerPrecision(mod, precision, report, ranges, for_cuda, x_dtype,
                                  bf16_dot=not for_cuda and bf16_dot_kernel(target) is not None)
        for gv, func in list(mod.functions_items()):
            if isinstance(func, relax.Function):
                mutator.builder_.update_func(gv, mutator.visit_expr(func))
        if mutator.smoothed:
            report.notes.append(f"activations smoothed per input channel in {mutator.smoothed} of "
                                f"{mutator.changed} int8 denses (calibrated ranges)")
        if not mutator.changed:
            what = "dense or gated-dense operator with a constant fp32 weight"
            report.notes.append(f"nothing to run in {precision}: no {what} (the model runs in fp32)")
            return mod
        return relax.transform.DeadCodeElimination()(mutator.builder_.get())

    return _pass


def apply_precision(mod: tvm.IRModule, precision: str, target: tvm.target.Target, calibration=None):
    """``(mod in precision, PrecisionReport)``. ``calibration``: sample input dicts; for int8 they calibrate
    activation smoothing (:mod:`.calibration`), without them int8 quantises activations as they are."""
    from ..targets import TargetInfo

    precision = check_precision(precision)
    info = TargetInfo.of(target)
    if not info.is_cpu and precision not in GPU_PRECISIONS.get(info.kind, ("fp32",)):
        raise InputError(f"precision {precision}: implemented for CPU (llvm) and CUDA targets only, not "
                         f"{target.kind.name}")
    report = PrecisionReport(precision, features=target_features(target, precision))
    ranges = None
    if precision == "int8":
        if calibration:
            from .calibration import GeneratedSamples, dense_input_ranges

            try:
                ranges = dense_input_ranges(mod, calibration)
            except InputError as err:
                if not isinstance(calibration, GeneratedSamples):
                    raise  # the user's inputs: they should hear that they do not fit
                report.notes.append(f"activation smoothing off: generated calibration inputs do not fit ({err})")
        else:
            report.notes.append("activation smoothing off: no calibration inputs (calibration=, --calibration)")
    return LowerPrecision(precision, report, ranges, for_cuda=info.kind == "cuda", target=target)(mod), report


def bf16_dot_kernel(target: Optional[tvm.target.Target]):
    """The target's bf16 dot-product kernel (``vdpbf16ps``), or None."""
    from ..schedules.cpu.dot_intrin import bf16_dot_kernel as kernel

    return kernel(target) if target is not None else None


def int8_activation_dtype(target: Optional[tvm.target.Target]) -> str:
    """``uint8``, or ``int16`` (the same values) where the target's int8 kernel multiplies int16 pairs."""
    from ..schedules.cpu.dot_intrin import int8_dot_kernel

    kernel = int8_dot_kernel(target) if target is not None else None
    return kernel.a_dtype if kernel is not None else "uint8"
