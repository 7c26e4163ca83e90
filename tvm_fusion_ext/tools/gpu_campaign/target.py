"""The target a campaign is built for (build side only: imports the compiler)."""

from __future__ import annotations

import os
import shutil


def campaign_target(arch: str):
    """``sm_80`` / ``sm_90`` → CUDA (nvcc when it is on PATH: TVM's default nvrtc needs the cuda-python
    bindings); ``llvm`` → this CPU family (x86-64-v3: any AVX2 machine), the rehearsal of the run side here."""
    from tvm_fusion_ext.targets import cuda_target, host_cpu_target

    if arch == "llvm":
        return host_cpu_target(mcpu="x86-64-v3")
    if shutil.which("nvcc"):
        os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    return cuda_target(arch)
