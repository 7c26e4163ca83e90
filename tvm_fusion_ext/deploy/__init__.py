"""The runtime-only floor: what running a compiled model needs, and nothing that compiles.

Everything here imports ``tvm.runtime`` and numpy only, so it works where TVM runs runtime-only
(``libtvm_compiler.so`` absent, or ``TVM_USE_RUNTIME_LIB=1``).

==============  ===============================================================================================
``loader``      :func:`load` an artifact directory → :class:`DeployedModel` (``run(inputs)`` by ONNX name)
``manifest``    the artifact format: layout, versions, checksums, the checks before anything is loaded
``describe``    :func:`describe` an artifact and every reason this machine could not load it, without loading it
``host``        whether this machine can run a library: CPU architecture and features, GPU
``weights``     the weights file: 64-byte aligned raw tensors, read onto 2 MiB pages or memory-mapped on load
``io``          inputs checked against their specs (symbolic dims and bounds), per-thread input buffers, outputs
``threads``     sizing TVM's CPU thread pool
``profile``     :func:`profile_kernels`: each kernel's share of a call, timed inside the VM where it is deployed
``generate``    :func:`generate`, :func:`generate_stream`: decoding over a KV-cache decoder (prefill, then one
                token per step), greedy or sampled, streamed, timed (:class:`GenerationStats`)
``sampling``    each step's token chosen as transformers' processors do (repetition penalty, temperature, top-k/p)
``decoder_io``  a decoder's inputs and outputs by role, its bounds, the in-place cache's buffers across steps
==============  ===============================================================================================
"""

from .describe import describe
from .generate import GenerationStats, generate, generate_stream
from .loader import DeployedModel, load
from .profile import KernelProfile, profile_kernels

__all__ = ["DeployedModel", "GenerationStats", "KernelProfile", "describe", "generate", "generate_stream", "load",
           "profile_kernels"]
