"""tvm_fusion_ext: semantic-aware Transformer fusion, fused operators and tuning for Apache TVM (Relax).

The public surface resolves lazily: ``import tvm_fusion_ext`` imports neither TVM's tensor intrinsics,
ONNX Runtime nor torch.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "SemanticFusion": ".transform.pipeline",
    "FusionReport": ".transform.report",
    "fuse": ".compile",
    "load_onnx": ".frontend",
    "build": ".compile",
    "compile_model": ".compile",
    "FusionExtError": ".errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
