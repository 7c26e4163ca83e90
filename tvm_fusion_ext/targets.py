"""Targets: what users type (``llvm``, ``cuda``, ``cuda:sm_90``) → complete TVM targets, and the one place
that says what a target can do (:class:`TargetInfo`).

TVM 0.27 refuses string targets like ``"cuda -arch=sm_90"``, and a CUDA target built from a bare dict lacks
the limits (shared memory, threads, registers) that templates and MetaSchedule's ``VerifyGPUCode`` read.
Everything that needs a target goes through :func:`resolve_target`; everything that needs a *fact* about a
target (its family, vector width and registers, core count, cache sizes, per-block and per-thread limits) reads
:meth:`TargetInfo.of`, so each fact is written once, here.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import tvm

from .errors import TargetError

# Per-block limits by architecture family (CUDA programming guide, "Technical Specifications"): the static
# shared-memory limit is 48 KiB on every arch; larger tiles need dynamic shared memory (opt-in, per arch).
_CUDA_LIMITS = {
    "max_shared_memory_per_block": 49152,
    "max_threads_per_block": 1024,
    "thread_warp_size": 32,
    "registers_per_block": 65536,
}
#: Registers one CUDA thread may use, on every architecture since Kepler (the programming guide's table).
CUDA_MAX_REGISTERS_PER_THREAD = 255
#: Cache sizes assumed when the host does not say (``/sys/devices/system/cpu`` unreadable): L1d, L2, L3.
_DEFAULT_CACHES = (32 * 1024, 512 * 1024, 0)
#: The widest access one CUDA thread issues as a single instruction (float4 / uint4); TVM's codegen has no
#: wider vector types either (8 fp32 lanes become ulonglong4 hacks that nvcc rejects).
CUDA_VECTOR_BYTES = 16
#: LLVM CPU names whose widest vector unit is AVX-512, for when LLVM itself cannot be asked.
_AVX512_CPUS = ("skylake-avx512", "cascadelake", "cooperlake", "icelake", "tigerlake", "sapphirerapids",
                "znver4", "znver5", "x86-64-v4")
_CUDA_ARCH = re.compile(r"^sm_(\d{2,3})a?$")

TargetSpec = Union[str, dict, tvm.target.Target, None]


@dataclass(frozen=True)
class TargetInfo:
    """Facts every template, lowering step and expert rule reads about a target.

    ``family`` is ``"cpu"`` (llvm) or ``"cuda"``; other kinds keep their kind name and have no templates.
    ``kind`` is TVM's kind name (``"llvm"``/``"cuda"``), which MetaSchedule's rule/postproc presets are keyed by.
    ``vector_bits`` is the widest vector one instruction (CPU) or one thread (CUDA) handles;
    ``vector_registers`` how many such registers a CPU core has (AVX2: 16 ymm; AVX-512: 32 zmm).
    ``l1_bytes``/``l2_bytes``/``l3_bytes``: a CPU target's data caches per level, this host's (the machine a
    CPU build is compiled on is the one it is tuned and measured on); 0 for a CUDA target, whose per-block
    limits are its ``max_*`` fields. ``max_registers_per_thread``: CUDA's per-thread register limit.
    """

    family: str
    kind: str
    arch: Optional[str]            # CUDA: sm_XX; CPU: the LLVM cpu name (mcpu)
    cores: int                     # CPU threads to use (the host's, for a CUDA target)
    vector_bits: int
    max_threads_per_block: int = 0
    max_shared_memory_per_block: int = 0
    warp_size: int = 0
    registers_per_block: int = 0
    max_registers_per_thread: int = 0
    vector_registers: int = 0
    l1_bytes: int = 0
    l2_bytes: int = 0
    l3_bytes: int = 0
    #: CUDA mma.sync (m16n8k16, sm_80 and later); False where a GPU-style target has no tensor cores (the
    #: OpenCL stand-in for a CUDA GPU, :func:`opencl_emulation_target`), so templates take their SIMT paths
    tensor_cores: bool = False

    @classmethod
    def of(cls, target: tvm.target.Target) -> "TargetInfo":
        kind = target.kind.name
        keys = {str(k) for k in target.keys}
        family = "cuda" if ("cuda" in keys or "gpu" in keys) else "cpu" if "cpu" in keys else kind
        attrs = target.attrs
        host = target.host if family == "cuda" and target.host is not None else target
        if family == "cuda":
            get = lambda k: int(attrs[k]) if attrs.get(k) is not None else _CUDA_LIMITS[k]  # noqa: E731
            arch = str(attrs.get("arch") or "") or None
            match = _CUDA_ARCH.match(arch or "")
            # An OpenCL target (the SIMT templates run on a CPU by PoCL) is scheduled as this family: same limits,
            # same templates, but no tensor-core instructions; its warp is one work-item (TVM's cross-thread
            # reductions then go through shared memory, not warp shuffles).
            tensor_cores = kind == "cuda" and (match is None or int(match.group(1)) >= 80)
            return cls(family, kind, arch, _cores(host), CUDA_VECTOR_BYTES * 8,
                       get("max_threads_per_block"), get("max_shared_memory_per_block"), get("thread_warp_size"),
                       get("registers_per_block"), max_registers_per_thread=CUDA_MAX_REGISTERS_PER_THREAD,
                       tensor_cores=tensor_cores)
        mcpu = str(attrs.get("mcpu") or "") if attrs is not None else ""
        bits = _cpu_vector_bits(target)
        l1, l2, l3 = host_caches()
        return cls(family, kind, mcpu or None, _cores(target), bits, vector_registers=32 if bits >= 512 else 16,
                   l1_bytes=l1, l2_bytes=l2, l3_bytes=l3)

    @property
    def is_cpu(self) -> bool:
        return self.family == "cpu"

    @property
    def is_cuda(self) -> bool:
        return self.family == "cuda"

    @property
    def vector_register_bytes(self) -> int:
        """A CPU core's vector register file: ``vector_registers`` registers of ``vector_bits``."""
        return self.vector_registers * self.vector_bits // 8

    def lanes(self, dtype: str = "float32") -> int:
        """Elements of ``dtype`` in one vector (fp32: 8 on AVX2, 16 on AVX-512, 4 per CUDA thread)."""
        return max(1, self.vector_bits // tvm.runtime.DataType(dtype).bits)

    def limits(self) -> dict:
        """CUDA per-block limits under the short names templates use."""
        return {"threads": self.max_threads_per_block, "smem": self.max_shared_memory_per_block,
                "warp": self.warp_size, "registers": self.registers_per_block}


@functools.lru_cache(maxsize=None)
def host_caches() -> Tuple[int, int, int]:
    """This host's L1 data, L2 and L3 cache sizes in bytes (cpu0's, from ``/sys/devices/system/cpu``; 32 KiB,
    512 KiB and 0 for a level it does not list)."""
    return tuple(_cache_bytes(level, default) for level, default in zip((1, 2, 3), _DEFAULT_CACHES))


def _cache_bytes(level: int, default: int) -> int:
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(base)):
            path = os.path.join(base, entry)
            with open(os.path.join(path, "level")) as f:
                lvl = int(f.read())
            with open(os.path.join(path, "type")) as f:
                kind = f.read().strip()
            if lvl == level and kind in ("Data", "Unified"):
                with open(os.path.join(path, "size")) as f:
                    text = f.read().strip().upper()
                scale = {"K": 1024, "M": 1024 ** 2}.get(text[-1], 1)
                return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return default


def _cores(target: tvm.target.Target) -> int:
    n = target.attrs.get("num-cores") if target.attrs is not None else None
    return int(n) if n is not None and int(n) > 0 else usable_cores()


def _cpu_vector_bits(target: tvm.target.Target) -> int:
    attrs = target.attrs
    mcpu = str(attrs.get("mcpu") or "") if attrs is not None else ""
    mattr = " ".join(str(a) for a in (attrs.get("mattr") or [])) if attrs is not None else ""
    if "-avx512f" in mattr:
        return 256
    if "avx512" in mattr:
        return 512
    # Ask LLVM what the named CPU has: a list of names goes stale with every new CPU (an Emerald Rapids host
    # read as AVX2 got 8-lane tiles and had its 16-lane candidates rejected as unrunnable).
    if mcpu and str(target.kind.name) == "llvm":
        from tvm.target import codegen

        try:
            return 512 if codegen.llvm_cpu_has_features("avx512f", target) else 256
        except Exception:  # noqa: BLE001  (a CPU or triple LLVM cannot describe: fall back to the names below)
            pass
    return 512 if mcpu.startswith(_AVX512_CPUS) else 256


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask), not the machine's total."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def host_cpu_target(num_cores: int | None = None, mcpu: str | None = None) -> tvm.target.Target:
    """The machine we run on: its LLVM CPU name (AVX2/AVX-512 codegen) and its core count. ``mcpu`` names
    another CPU of this architecture instead, e.g. ``x86-64-v3`` (any AVX2+FMA machine) for a library that
    must run on other machines than this one."""
    from tvm.target import codegen

    cores = usable_cores() if num_cores is None else num_cores
    if mcpu is None:
        mcpu = str(codegen.llvm_get_system_cpu())
    elif not codegen.llvm_is_valid_cpu(mcpu, str(codegen.llvm_get_system_triple())):
        raise TargetError(f"unknown LLVM CPU '{mcpu}' for {codegen.llvm_get_system_triple()} (e.g. x86-64-v2, "
                          f"x86-64-v3, x86-64-v4, skylake-avx512, znver3; this machine is "
                          f"{codegen.llvm_get_system_cpu()})")
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": int(cores)})


def cuda_target(arch: str = "sm_90") -> tvm.target.Target:
    if not _CUDA_ARCH.match(arch):
        raise TargetError(f"unknown CUDA architecture '{arch}' (expected e.g. sm_80 or sm_90)")
    return tvm.target.Target({"kind": "cuda", "arch": arch, **_CUDA_LIMITS}, host=host_cpu_target())


def opencl_emulation_target() -> tvm.target.Target:
    """An OpenCL target that stands in for a CUDA GPU, so that the CUDA family's SIMT templates (thread bindings,
    shared memory, barriers) can be compiled to OpenCL C and run on a CPU by PoCL
    (:mod:`tvm_fusion_ext.tools.simt_on_cpu`). It carries the CUDA per-block limits, so templates choose the
    same tiles as for a GPU; :attr:`TargetInfo.tensor_cores` is False on it. Not a deployment target."""
    limits = {**_CUDA_LIMITS, "thread_warp_size": 1, "max_num_threads": _CUDA_LIMITS["max_threads_per_block"]}
    limits.pop("registers_per_block")
    return tvm.target.Target({"kind": "opencl", **limits}, host=host_cpu_target())


def resolve_target(spec: TargetSpec = None) -> tvm.target.Target:
    """``None``/"llvm"/"cpu" → this CPU; "llvm:CPU" → that LLVM CPU (e.g. ``llvm:x86-64-v3``); "cuda"/"cuda:sm_XX"
    → CUDA; dicts and Targets pass through (completed)."""
    if spec is None:
        return host_cpu_target()
    if isinstance(spec, tvm.target.Target):
        return _complete(spec)
    if isinstance(spec, dict):
        try:
            return _complete(tvm.target.Target(spec))
        except Exception as err:  # noqa: BLE001  (TVM raises several types for a bad dict)
            raise TargetError(f"invalid target {spec}: {str(err).splitlines()[0]}") from None
    text = str(spec).strip()
    if text in ("llvm", "cpu"):
        return host_cpu_target()
    if text.startswith("llvm:"):
        return host_cpu_target(mcpu=text.split(":", 1)[1].strip())
    if text == "cuda":
        dev = tvm.cuda(0)  # the local GPU's architecture when there is one
        return cuda_target("sm_" + str(dev.compute_version).replace(".", "") if dev.exist else "sm_90")
    if text.startswith("cuda:"):
        return cuda_target(text.split(":", 1)[1])
    if "/" in text:  # a TVM tag such as "nvidia/nvidia-h100"
        try:
            return _complete(tvm.target.Target(text, host=host_cpu_target()))
        except Exception:  # noqa: BLE001
            pass
    raise TargetError(f"unknown target '{text}' (use llvm, llvm:CPU, cuda or cuda:sm_80 / cuda:sm_90)")


def resolved_target(spec: TargetSpec) -> tvm.target.Target:
    """A :class:`tvm.target.Target` as it is (an entry point resolved it already); any other spec through
    :func:`resolve_target`. What the compile steps below an entry point call, so that a compilation resolves its
    target once and each building block (``lower``, ``schedule``, ...) still takes ``"llvm"`` when called alone."""
    return spec if isinstance(spec, tvm.target.Target) else resolve_target(spec)


def default_target(kind: str = "llvm") -> tvm.target.Target:
    """This machine's CPU (``kind="llvm"``) or GPU (``kind="cuda"``) as a complete Target."""
    if kind not in ("llvm", "cuda"):
        raise TargetError(f"unknown target kind '{kind}' (known: llvm, cuda)")
    return resolve_target(kind)


def device_of(target: tvm.target.Target):
    """The TVM device a build for ``target`` runs on in this process."""
    return tvm.cuda(0) if TargetInfo.of(target).is_cuda else tvm.cpu(0)


def _complete(target: tvm.target.Target) -> tvm.target.Target:
    if target.kind.name == "cuda":
        missing = {k: v for k, v in _CUDA_LIMITS.items() if target.attrs.get(k) is None}
        if missing or target.host is None:
            cfg = dict(target.export())
            cfg.pop("host", None)
            cfg.update(missing)
            return tvm.target.Target(cfg, host=target.host or host_cpu_target())
    return target
