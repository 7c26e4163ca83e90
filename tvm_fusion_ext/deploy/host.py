"""Can this machine run a library built for that target? Checked from the manifest, before the library is loaded.

A library compiled with AVX-512 instructions dies with SIGILL on an AVX2 machine, at the first call, with no
message. So the artifact records the LLVM features its target enabled, and the loader compares the ones that
generated code can contain (vector ISA, FMA, bit manipulation...) with the flags the kernel reports in
``/proc/cpuinfo``. LLVM's other "features" are tuning hints (``fast-gather``, ``slow-3ops-lea``) or system
instructions no kernel emits (``mwaitx``, ``xsaves``); they are recorded but not checked.
"""

from __future__ import annotations

import platform
from typing import Dict, Iterable, List, Optional, Set

from ..errors import IncompatibleArtifactError

CPUINFO = "/proc/cpuinfo"

#: LLVM feature name → the /proc/cpuinfo flag meaning the CPU has it, per architecture (Linux's names).
LLVM_TO_CPUINFO: Dict[str, Dict[str, str]] = {
    "x86_64": {
        "sse": "sse", "sse2": "sse2", "sse3": "pni", "ssse3": "ssse3", "sse4.1": "sse4_1", "sse4.2": "sse4_2",
        "sse4a": "sse4a", "avx": "avx", "avx2": "avx2", "fma": "fma", "fma4": "fma4", "xop": "xop", "f16c": "f16c",
        "bmi": "bmi1", "bmi2": "bmi2", "lzcnt": "abm", "popcnt": "popcnt", "movbe": "movbe", "adx": "adx",
        "cmov": "cmov", "cx16": "cx16", "aes": "aes", "pclmul": "pclmulqdq", "vaes": "vaes",
        "vpclmulqdq": "vpclmulqdq", "gfni": "gfni", "sha": "sha_ni",
        "avx512f": "avx512f", "avx512cd": "avx512cd", "avx512bw": "avx512bw", "avx512dq": "avx512dq",
        "avx512vl": "avx512vl", "avx512ifma": "avx512ifma", "avx512vbmi": "avx512vbmi",
        "avx512vbmi2": "avx512_vbmi2", "avx512vnni": "avx512_vnni", "avx512bitalg": "avx512_bitalg",
        "avx512vpopcntdq": "avx512_vpopcntdq", "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16",
        "avxvnni": "avx_vnni", "amx-tile": "amx_tile", "amx-int8": "amx_int8", "amx-bf16": "amx_bf16",
    },
    "aarch64": {
        "neon": "asimd", "fp-armv8": "fp", "crc": "crc32", "aes": "aes", "sha2": "sha2", "sha3": "sha3",
        "sm4": "sm4", "lse": "atomics", "rdm": "asimdrdm", "fullfp16": "asimdhp", "fp16fml": "asimdfhm",
        "dotprod": "asimddp", "sve": "sve", "sve2": "sve2", "i8mm": "i8mm", "bf16": "bf16",
    },
}
_ARCH_ALIASES = {"amd64": "x86_64", "x86-64": "x86_64", "arm64": "aarch64"}


def normalise_arch(name: str) -> str:
    name = str(name).lower()
    return _ARCH_ALIASES.get(name, name)


def arch_of_triple(triple: str) -> str:
    """``x86_64-pc-linux-gnu`` → ``x86_64``."""
    return normalise_arch(str(triple).split("-")[0])


def machine_arch() -> str:
    return normalise_arch(platform.machine())


def cpu_flags(cpuinfo: str = CPUINFO) -> Optional[Set[str]]:
    """This CPU's feature flags as the kernel reports them (``flags`` on x86, ``Features`` on ARM); None when
    there is no cpuinfo to read (not Linux)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip().lower() in ("flags", "features"):
                    return set(value.split())
    except OSError:
        return None
    return set()


def checked_features(arch: str, llvm_features: Iterable[str]) -> List[str]:
    """The features of ``llvm_features`` that generated code may use, hence that the loader checks."""
    table = LLVM_TO_CPUINFO.get(normalise_arch(arch), {})
    return sorted(f for f in set(llvm_features) if f in table)


def missing_features(arch: str, llvm_features: Iterable[str], flags: Set[str]) -> List[str]:
    """LLVM names of the checked features this CPU lacks."""
    table = LLVM_TO_CPUINFO.get(normalise_arch(arch), {})
    return [f for f in checked_features(arch, llvm_features) if table[f] not in flags]


def check_cpu(path: str, cpu: dict, flags: Optional[Set[str]] = None) -> None:
    """Refuse a library whose LLVM code (the whole model on CPU, the host side on CUDA) needs an architecture or
    CPU features this machine lacks. ``cpu`` is the manifest's ``target.cpu`` entry."""
    arch = arch_of_triple(cpu.get("triple", ""))
    here = machine_arch()
    if arch != here:
        raise IncompatibleArtifactError(f"{path}: compiled for {arch} ({cpu.get('triple')}), this machine is {here}")
    flags = cpu_flags() if flags is None else flags
    if flags is None:
        raise IncompatibleArtifactError(
            f"{path}: cannot read this machine's CPU features ({CPUINFO}) to check the library's "
            f"({', '.join(cpu.get('checked_features', [])) or 'none'}); pass check_cpu=False to load it anyway")
    missing = missing_features(arch, cpu.get("checked_features", []), flags)
    if missing:
        raise IncompatibleArtifactError(
            f"{path}: compiled for CPU {cpu.get('mcpu') or 'generic'} with {', '.join(missing)}, which this CPU "
            f"lacks (running it would crash with an illegal instruction): recompile here, or for a CPU both "
            f"machines can run (--target llvm:CPU, e.g. llvm:x86-64-v3 for any AVX2 machine)")


def load_cuda_runtime() -> bool:
    """Make sure TVM's CUDA runtime (``libtvm_runtime_cuda.so``: the CUDA device API and the loader of CUDA kernels
    inside a library) is loaded; True if it is. The full TVM loads it when its CUDA backend registers; a runtime-only
    TVM (no ``libtvm_compiler.so``, or ``TVM_USE_RUNTIME_LIB=1``) skips the backends, so on a GPU machine with only
    the runtime ``tvm.cuda(0)`` reported no GPU and a CUDA library failed to load ("a loader of that name is not
    registered"; found running ``scripts/gpu_check.py`` on an H100). Without a driver (``libcuda.so.1``) it stays
    unloaded, and :func:`check_gpu` refuses the artifact in one line."""
    import ctypes
    import os

    import tvm

    loaded = tvm.base._LOADED_LIBS
    if tvm.base._RUNTIME_ONLY:
        _compile_cuda_source_at_load()
    if "tvm_runtime_cuda" in loaded:
        return True
    path = os.path.join(os.path.dirname(os.path.realpath(loaded["tvm_runtime"]._name)), "libtvm_runtime_cuda.so")
    try:
        loaded["tvm_runtime_cuda"] = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)  # registers itself with the runtime
    except OSError:  # no such library in this TVM, or no CUDA driver on this machine
        return False
    return True


def _compile_cuda_source_at_load() -> None:
    """A CUDA library exported by TVM 0.27 carries its kernels as CUDA source, compiled when the library loads by
    TVM's Python callback (``tvm.support.nvcc.tvm_callback_cuda_compile``). That callback asks
    ``tvm.target.Target.current()`` for the architecture, an FFI function of the compiler library: a runtime-only
    TVM raised AttributeError there (on the H100). With no current target the callback reads the architecture from
    the GPU, so ``Target.current`` answers None where the FFI function is missing. TVM compiles with nvrtc unless
    ``TVM_CUDA_COMPILE_MODE`` says nvcc; nvrtc needs the cuda-python bindings, so where they are missing and nvcc is
    on PATH, nvcc compiles."""
    import importlib.util
    import os
    import shutil

    from tvm.support import nvcc  # the module of TVM's compile callback, which a CUDA library calls as it loads

    try:
        nvcc.Target.current(allow_none=True)
    except AttributeError:  # module 'tvm.target._ffi_api' has no attribute 'TargetCurrent'
        nvcc.Target.current = staticmethod(lambda allow_none=True: None)
    if "TVM_CUDA_COMPILE_MODE" not in os.environ and shutil.which("nvcc"):
        try:
            has_nvrtc = importlib.util.find_spec("cuda.bindings") is not None
        except ImportError:  # no "cuda" package at all
            has_nvrtc = False
        if not has_nvrtc:
            os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"


def check_gpu(path: str, arch: Optional[str], device) -> None:
    """Refuse a CUDA library without a GPU, or on a GPU older than the architecture it was compiled for."""
    if not device.exist:
        raise IncompatibleArtifactError(f"{path}: compiled for CUDA {arch or ''}, and this machine has no CUDA GPU "
                                        f"(or no driver)".replace("  ", " "))
    if arch:
        have = int(str(device.compute_version).replace(".", ""))
        need = int("".join(ch for ch in arch if ch.isdigit()))
        if have < need:
            raise IncompatibleArtifactError(f"{path}: compiled for CUDA {arch}, this GPU is sm_{have}: recompile "
                                            f"with --target cuda:sm_{have}")


def cuda_device(path: str, arch: Optional[str], device_id: int = 0):
    """The CUDA device a library compiled for ``arch`` runs on here, once TVM's CUDA runtime is loaded and the
    device checked (:func:`check_gpu`)."""
    import tvm

    load_cuda_runtime()
    device = tvm.cuda(device_id)
    check_gpu(path, arch, device)
    return device
