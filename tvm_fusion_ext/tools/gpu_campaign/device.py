"""The run side's device (runtime only: tvm.runtime and torch, nothing that compiles)."""

from __future__ import annotations


def run_device(arch: str):
    """``(tvm device, torch device name, device description)`` for a campaign built for ``arch``: the GPU (TVM's
    CUDA runtime loaded by hand, as a runtime-only TVM skips it) or, for an ``llvm`` rehearsal, the CPU."""
    import tvm

    if arch == "llvm":
        return tvm.cpu(0), "cpu", "cpu (rehearsal)"
    import torch

    from tvm_fusion_ext.deploy.host import load_cuda_runtime

    if not load_cuda_runtime():
        raise SystemExit("TVM's CUDA runtime (libtvm_runtime_cuda.so) does not load here")
    return tvm.cuda(0), "cuda", torch.cuda.get_device_name(0)
