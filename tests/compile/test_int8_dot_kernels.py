"""int8 dense on the x86 dot-product instructions (schedules/cpu/dot_intrin.py, the ``dot_panels`` layout of
ops/dense_int8.py): the packing, numerics at odd shapes against numpy (exact int32 accumulation), the instruction
in the assembly for each CPU class (compiled here, run only where the host has it), the features recorded."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from tvm_fusion_ext.compile import compile_model
from tvm_fusion_ext.compile.precision import target_features
from tvm_fusion_ext.deploy import host
from tvm_fusion_ext.ops.dense_int8 import pack_dot_panels, quantize_weight
from tvm_fusion_ext.ops.registry import call_op
from tvm_fusion_ext.schedules.cpu.dot_intrin import AVX2_PMADDWD, AVX512_VNNI, AVX_VNNI, int8_dot_kernel
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.testing import numpy_activation, quantize_rows_reference

FLAGS = host.cpu_flags() or set()


def _needs(flag):
    return pytest.mark.skipif(host.machine_arch() != "x86_64" or flag not in FLAGS,
                              reason=f"this CPU lacks {flag} (reads /proc/cpuinfo)")


def _module(rows, K, N, act="relu", seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((K, N)) / math.sqrt(K)).astype("float32")
    b = rng.standard_normal(N).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((*rows, K), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            d = bb.emit(call_op(bb, "fused_dense", {"x": x, "w": relax.const(w), "bias": relax.const(b)},
                                {"act": act}))
            out = bb.emit_output(d)
        bb.emit_func_output(out)
    return bb.get(), w, b


def _quantized_reference(x, w, b, act):
    """numpy: per-row u8 activations, per-channel s8 weights, the integer dot product exactly."""
    xq, scale, zero = quantize_rows_reference(x)
    wq, w_scale, _ = quantize_weight(w)
    acc = (xq - zero) @ wq.astype(np.float64)
    return numpy_activation(acc * scale * w_scale.astype(np.float64) + b, act)


def _asm(compiled) -> str:
    return compiled.executable.mod.imports[0].inspect_source("asm")


def _run(compiled, x):
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_dot_panels_interleave_k_groups_per_column_and_pad_with_zeros():
    w = np.arange(5 * 3, dtype=np.int8).reshape(5, 3)  # K = 5, N = 3
    p = pack_dot_panels(w, nr=2, group=2)
    assert p.shape == (2, 3, 2, 2)  # ceil(3/2) panels, ceil(5/2) k-pairs, 2 columns, 2 k
    assert list(p[0, 0, 1]) == [w[0, 1], w[1, 1]] and list(p[1, 2, 0]) == [w[4, 2], 0]
    assert (p[1, :, 1] == 0).all()  # the padding column


@pytest.mark.parametrize("mcpu,kernel", [("znver3", AVX2_PMADDWD), ("x86-64-v3", AVX2_PMADDWD),
                                         ("alderlake", AVX_VNNI), ("znver4", AVX512_VNNI),
                                         ("sapphirerapids", AVX512_VNNI), ("x86-64", None)])
def test_kernel_follows_the_targets_features(mcpu, kernel):
    assert int8_dot_kernel(resolve_target(f"llvm:{mcpu}")) == kernel


@pytest.mark.parametrize("mcpu,instruction,register,features", [
    ("x86-64-v3", "vpmaddwd", "%ymm", ["avx2"]),
    ("alderlake", "vpdpbusd", "%ymm", ["avx2", "avxvnni"]),
    ("znver4", "vpdpbusd", "%zmm", ["avx2", "avx512f", "avx512bw", "avx512vnni"]),
    ("sapphirerapids", "vpdpbusd", "%zmm", ["avx2", "avx512f", "avx512bw", "avx512vnni"]),
])
def test_the_dot_product_instruction_is_in_the_assembly(mcpu, instruction, register, features):
    """Compiled for each CPU class (run nowhere): the micro-kernel is the instruction, not a widen-and-multiply."""
    target = resolve_target(f"llvm:{mcpu}")
    mod, _, _ = _module((2, 8), 100, 80)  # K a multiple of neither 8 nor 64, N not a panel multiple
    compiled = compile_model(mod, target, fuse_graph=False, precision="int8")
    asm = _asm(compiled)
    lines = [line for line in asm.splitlines() if instruction in line.split()]  # AVX-VNNI's: "{vex} vpdpbusd'
    assert lines and all(register in line for line in lines), lines[:4]
    assert compiled.precision.features == features


def test_without_avx2_the_scalar_loop_runs_and_records_no_dot_feature():
    compiled = compile_model(_module((4,), 16, 8)[0], resolve_target("llvm:x86-64"), fuse_graph=False,
                             precision="int8")
    assert "vpmaddwd" not in _asm(compiled) and compiled.precision.features == []
    assert target_features(resolve_target("llvm:x86-64"), "int8") == []


SHAPES = [((13,), 37, 40), ((7,), 13, 100), ((2, 3), 24, 48), ((4, 5), 129, 17), ((1,), 3, 9), ("sym", 41, 33),
          ("sym", 64, 48)]


def _numerics(rows, K, N, act, target):
    if rows == "sym":
        module_rows, run_rows = (2, tirx.Var("seq", "int64")), (2, 7)
    else:
        module_rows = run_rows = rows
    mod, w, b = _module(module_rows, K, N, act)
    compiled = compile_model(mod, target, fuse_graph=False, precision="int8")
    x = (np.random.default_rng(2).standard_normal((*run_rows, K)) + 0.3).astype("float32")
    np.testing.assert_allclose(_run(compiled, x), _quantized_reference(x, w, b, act), rtol=1e-5, atol=1e-4)
    return compiled


@_needs("avx2")
@pytest.mark.parametrize("rows,K,N", SHAPES)
def test_pmaddwd_kernel_matches_numpy(rows, K, N):
    """K odd (its last product in the epilogue), N not a multiple of the panel, symbolic rows, a 1-row input."""
    compiled = _numerics(rows, K, N, "relu", resolve_target("llvm:x86-64-v3"))
    assert "vpmaddwd" in _asm(compiled)


@_needs("avx512_vnni")
@pytest.mark.parametrize("rows,K,N", SHAPES)
def test_avx512_vnni_kernel_matches_numpy(rows, K, N):
    compiled = _numerics(rows, K, N, "gelu", resolve_target("llvm:icelake-server"))
    assert "vpdpbusd" in _asm(compiled)


@_needs("avx_vnni")
@pytest.mark.parametrize("rows,K,N", SHAPES)
def test_avx_vnni_kernel_matches_numpy(rows, K, N):
    compiled = _numerics(rows, K, N, "gelu", resolve_target("llvm:alderlake"))
    assert "vpdpbusd" in _asm(compiled)
