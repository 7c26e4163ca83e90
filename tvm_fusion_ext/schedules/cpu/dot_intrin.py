"""x86 dot-product tensor intrinsics for the int8 and bf16 dense micro-kernels, and which one a target gets.

Each intrinsic computes ``C[l] += sum_g int32(A[g]) * int32(B[l, g])`` for ``lanes`` int32 accumulators and a
group of ``group`` consecutive k: ``A`` (``group`` u8 activations of one row) is broadcast to every lane, ``B`` is
``lanes × group`` s8 weights, k-interleaved (the ``dot_panels`` weight layout of :mod:`...ops.dense_int8`). The
arithmetic is exact in every implementation (no saturating step), so the results equal the scalar int32 loop bit
for bit:

``avx2_pmaddwd`` (8 lanes, pairs)
    AVX2: the pair of activations (u8 values, stored as int16 by the quantisation in front of the kernel, so
    that a pair is one 32-bit broadcast from memory: widening u8 pairs in the kernel took 4 instructions per row
    and k-pair, as many as the two ``vpmaddwd`` they feed) broadcast as one int32; the 16 weights
    sign-extended to int16 (``vpmovsxbw``); ``vpmaddwd`` multiplies the 16 int16 pairs and adds each pair into
    an int32 (u8 · s8 products and their pair sums fit int16 · int16 → int32 exactly); ``vpaddd`` accumulates.
    Two k per instruction against one for ``vpmovsx`` + ``vpmulld``, which is also a 10-cycle, 2-uop multiply
    on Zen 3 and Intel cores. ``vpmaddubsw`` (u8 × s8 → saturating int16 pair sums) would do 2× the MACs
    per instruction but saturates (255 · 127 · 2 > 32767) unless the weights are 7-bit, the accuracy ONNX
    Runtime's ``reduce_range`` gives up; it is not used.
``avx512_vnni`` (16 lanes, quads) / ``avx_vnni`` (8 lanes, quads)
    ``vpdpbusd``: u8 × s8 quads summed into int32 with no intermediate rounding or saturation.

``avx512_bf16`` (16 lanes, pairs; bf16 precision)
    ``vdpbf16ps``: ``C[l] += A[0]·B[l, 0] + A[1]·B[l, 1]`` in fp32, the operands bfloat16 (stored as their uint16
    bit patterns, the pair of activations one 32-bit broadcast). The products are exact; the instruction adds
    the odd k's before the even k's, each addition rounded to nearest even, and treats denormals as zero, so it
    matches the widen + FMA loop (k in order, denormals kept) to a few ulps, not bit for bit. Its bfloat16
    operands are typed in LLVM IR linked into the function (:func:`dpbf16ps_wrapper`).

Registered once per process, under names that say the instruction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import tvm


@dataclass(frozen=True)
class DotKernel:
    name: str        #: the registered TensorIntrin
    lanes: int       #: int32 accumulators per instruction (output columns)
    group: int       #: consecutive k per lane (the weight layout's innermost axis)
    llvm_intrin: str
    features: tuple  #: LLVM features the kernel needs on the running CPU
    instruction: str  #: the instruction the assembly shows
    a_dtype: str     #: the activations' type in memory (their values are u8's)
    operands: str = "u8s8"  #: "u8s8" (int32 accumulators) or "bf16" (bit patterns in uint16, fp32 accumulators)


AVX2_PMADDWD = DotKernel("tfx_dot_8x2_u8s8_pmaddwd", 8, 2, "llvm.x86.avx2.pmadd.wd", ("avx2",), "vpmaddwd", "int16")
AVX512_VNNI = DotKernel("tfx_dot_16x4_u8s8_vnni512", 16, 4, "llvm.x86.avx512.vpdpbusd.512",
                        ("avx512vnni", "avx512f"), "vpdpbusd", "uint8")
AVX_VNNI = DotKernel("tfx_dot_8x4_u8s8_vnni256", 8, 4, "llvm.x86.avx512.vpdpbusd.256", ("avxvnni",), "vpdpbusd",
                     "uint8")
KERNELS = (AVX512_VNNI, AVX_VNNI, AVX2_PMADDWD)
AVX512_BF16 = DotKernel("tfx_dot_16x2_bf16_dpbf16ps512", 16, 2, "llvm.x86.avx512bf16.dpbf16ps.512",
                        ("avx512bf16", "avx512f"), "vdpbf16ps", "uint16", "bf16")
BF16_KERNELS = (AVX512_BF16,)


def _features(target: tvm.target.Target) -> set:
    from tvm.target import codegen

    try:
        return {str(f) for f in codegen.llvm_get_cpu_features(target)}
    except Exception:  # noqa: BLE001  (not an LLVM CPU target)
        return set()


def int8_dot_kernel(target: Optional[tvm.target.Target]) -> Optional[DotKernel]:
    """The widest dot-product kernel ``target``'s features allow, or None (no AVX2: the scalar int32 loop)."""
    if target is None or str(target.kind.name) != "llvm":
        return None
    have = _features(target)
    wide = "avx512f" in have and "-avx512f" not in " ".join(str(a) for a in (target.attrs.get("mattr") or []))
    for kernel in KERNELS:
        if kernel is AVX512_VNNI and not wide:
            continue
        if all(f in have for f in kernel.features):
            return kernel
    return None


def bf16_dot_kernel(target: Optional[tvm.target.Target]) -> Optional[DotKernel]:
    """``vdpbf16ps`` (16 lanes) where ``target`` has AVX512_BF16 and 512-bit vectors, else None (the bf16 weights
    are widened in registers and multiplied with fp32 FMAs)."""
    if target is None or str(target.kind.name) != "llvm":
        return None
    have = _features(target)
    if "-avx512f" in " ".join(str(a) for a in (target.attrs.get("mattr") or [])):
        return None
    return AVX512_BF16 if all(f in have for f in AVX512_BF16.features) else None


def kernel_by_name(name: str) -> DotKernel:
    return next(k for k in (*KERNELS, *BF16_KERNELS) if k.name == name)


def _llvm_major() -> int:
    from tvm.target import codegen

    return int(codegen.llvm_version_major())


_registered: set = set()


def register(kernel: DotKernel) -> str:
    """Register ``kernel``'s TensorIntrin (once per process); returns its name."""
    if kernel.name in _registered:
        return kernel.name
    from tvm.s_tir import TensorIntrin

    try:
        TensorIntrin.get(kernel.name, allow_missing=False)
    except Exception:  # noqa: BLE001  (not registered yet)
        desc, impl = _prim_funcs(kernel)
        TensorIntrin.register(kernel.name, desc, impl)
    _registered.add(kernel.name)
    return kernel.name


def register_all() -> None:
    """Every kernel's TensorIntrin: what a tuning record of any x86 CPU may name."""
    for kernel in (*KERNELS, *BF16_KERNELS):
        register(kernel)


def _prim_funcs(kernel: DotKernel):
    if kernel.operands == "bf16":
        return _bf16_prim_funcs(kernel)
    from tvm.script import tirx as T

    lanes, group, a_dtype = kernel.lanes, kernel.group, kernel.a_dtype

    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((group,), a_dtype, offset_factor=1), B: T.Buffer((lanes, group), "int8", offset_factor=1),
             C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:group], B[0:lanes, 0:group])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, group):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    if kernel.group == 2:
        @T.prim_func(s_tir=True)
        def impl(A: T.Buffer((group,), a_dtype, offset_factor=1),
                 B: T.Buffer((lanes, group), "int8", offset_factor=1),
                 C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local")) -> None:
            with T.sblock("root"):
                T.reads(C[0:lanes], A[0:group], B[0:lanes, 0:group])
                T.writes(C[0:lanes])
                a_pair = T.reinterpret(A.vload([0], "int16x2"), dtype="int32")
                a = T.reinterpret(T.broadcast(a_pair, lanes), dtype="int16x16")
                b = T.Cast("int16x16", B.vload([0, 0], dtype="int8x16"))
                C[T.ramp(T.int32(0), 1, lanes)] = C.vload([0], dtype="int32x8") + T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(kernel.llvm_intrin), a, b, dtype="int32x8")
        return desc, impl

    wide = lanes * group
    # LLVM 22 declares vpdpbusd's multiplicands as i8 vectors (<64 x i8> for the 512-bit form); earlier releases
    # as i32 vectors, the form TVM's own tensor_intrin/x86.py still emits (LLVM 22 rejects it)
    operand = f"int8x{wide}" if _llvm_major() >= 22 else f"int32x{lanes}"

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((group,), a_dtype, offset_factor=1), B: T.Buffer((lanes, group), "int8", offset_factor=1),
             C: T.Buffer((lanes,), "int32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:group], B[0:lanes, 0:group])
            T.writes(C[0:lanes])
            a = T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], f"uint8x{group}"), dtype="int32"), lanes),
                              dtype=operand)
            b = T.reinterpret(B.vload([0, 0], dtype=f"int8x{wide}"), dtype=operand)
            C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(kernel.llvm_intrin), C.vload([0], dtype=f"int32x{lanes}"), a, b,
                dtype=f"int32x{lanes}")
    return desc, impl


def bf16_bits_to_float(v):
    """A bfloat16 bit pattern (uint16) as the float32 it stands for: the bits shifted into the high half."""
    from tvm import tirx

    return tirx.reinterpret("float32", tirx.Cast("uint32", v) << tirx.const(16, "uint32"))


def dpbf16ps_wrapper(kernel: DotKernel) -> str:
    """LLVM IR of a function that calls ``kernel``'s intrinsic on bfloat16 bit patterns passed as i16 vectors.

    LLVM 22 declares ``llvm.x86.avx512bf16.dpbf16ps.512`` as ``(<16 x float>, <32 x bfloat>, <32 x bfloat>)``,
    and TVM 0.27 cannot write a ``<32 x bfloat>`` operand: BF16ComputeLegalize rewrites every bfloat16 value
    (``T.reinterpret`` of a uint16 load included) into float32 (LLVM's verifier: "Call parameter type does not
    match function signature", ``<32 x float>`` given), BF16StorageLegalize turns what is left into uint16
    (``<32 x i16>`` given), and with both passes skipped the LLVM code generator crashes. Operands of another
    type (``<16 x i32>``, ``<32 x i16>``) are rejected the same way. So the bitcast is written in LLVM IR: this
    function, linked into the module through TIR's ``pragma_import_llvm`` (always inlined, so the call is one
    ``vdpbf16ps``), takes the bit patterns as ``<32 x i16>``, which a ``uint16x32`` TIR value is."""
    lanes = kernel.lanes
    wide = lanes * kernel.group
    return (f"define <{lanes} x float> @{kernel.name}(<{lanes} x float> %c, <{wide} x i16> %a, <{wide} x i16> %b)"
            f" alwaysinline {{\n"
            f"  %ab = bitcast <{wide} x i16> %a to <{wide} x bfloat>\n"
            f"  %bb = bitcast <{wide} x i16> %b to <{wide} x bfloat>\n"
            f"  %r = call <{lanes} x float> @{kernel.llvm_intrin}(<{lanes} x float> %c, <{wide} x bfloat> %ab,"
            f" <{wide} x bfloat> %bb)\n"
            f"  ret <{lanes} x float> %r\n}}\n"
            f"declare <{lanes} x float> @{kernel.llvm_intrin}(<{lanes} x float>, <{wide} x bfloat>,"
            f" <{wide} x bfloat>)\n")


#: the loop annotation that links :func:`dpbf16ps_wrapper` into the module (TIR's LLVM import pragma)
IMPORT_LLVM_KEY = "pragma_import_llvm"


def _bf16_prim_funcs(kernel: DotKernel):
    """``C[l] += float(A[k]) * float(B[l, k])`` over a pair of k, the operands bfloat16 bit patterns in uint16
    (no bfloat16 value in TIR: see :func:`dpbf16ps_wrapper`). The products of two bfloat16 are exact in fp32; the
    instruction adds the pair's odd k first and treats denormal inputs and outputs as zero, so its sums can differ
    from this description's (k in order) in the last bits, and where a value is an fp32 denormal."""
    from tvm.script import tirx as T

    lanes, group = kernel.lanes, kernel.group
    wide = lanes * group

    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((group,), "uint16", offset_factor=1), B: T.Buffer((lanes, group), "uint16", offset_factor=1),
             C: T.Buffer((lanes,), "float32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:group], B[0:lanes, 0:group])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, group):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.reinterpret(T.shift_left(T.Cast("uint32", A[vk]), T.uint32(16)),
                                                      dtype="float32") \
                            * T.reinterpret(T.shift_left(T.Cast("uint32", B[vi, vk]), T.uint32(16)), dtype="float32")

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((group,), "uint16", offset_factor=1), B: T.Buffer((lanes, group), "uint16", offset_factor=1),
             C: T.Buffer((lanes,), "float32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:group], B[0:lanes, 0:group])
            T.writes(C[0:lanes])
            a_pair = T.reinterpret(A.vload([0], f"uint16x{group}"), dtype="int32")
            a = T.reinterpret(T.broadcast(a_pair, lanes), dtype=f"uint16x{wide}")
            C[T.ramp(T.int32(0), 1, lanes)] = T.call_pure_extern(
                f"float32x{lanes}", kernel.name, C.vload([0], dtype=f"float32x{lanes}"), a,
                B.vload([0, 0], dtype=f"uint16x{wide}"))
    return desc, impl
