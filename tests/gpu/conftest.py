"""The GPU these tests run on, or a clean skip where there is none."""

import os
import shutil

import pytest
import tvm

from tvm_fusion_ext.targets import cuda_target


@pytest.fixture(scope="module")
def gpu():
    """``(device, target)`` for the first CUDA GPU, the target's arch read from the device."""
    dev = tvm.cuda(0)
    if not dev.exist:
        pytest.skip("no CUDA GPU")
    if shutil.which("nvcc"):  # TVM's default (nvrtc) needs the cuda-python bindings
        os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    major, minor = (int(x) for x in str(dev.compute_version).split("."))
    return dev, cuda_target(f"sm_{major}{minor}")
