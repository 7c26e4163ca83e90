"""The OpenCL stand-in for a CUDA GPU (PoCL on this CPU), or a clean skip where PoCL or pyopencl is missing."""

import pytest

from tvm_fusion_ext.targets import opencl_emulation_target


@pytest.fixture(scope="session")
def simt():
    """The OpenCL target the CUDA family's SIMT templates are compiled for here."""
    from tvm_fusion_ext.tools.simt_on_cpu import unavailable

    reason = unavailable()
    if reason:
        pytest.skip(f"SIMT kernels cannot run on this CPU: {reason}")
    return opencl_emulation_target()
