"""Independent float64 references the benchmarks check our kernels against (numpy only)."""

from __future__ import annotations

import numpy as np


def numpy_activation(v: np.ndarray, act: str) -> np.ndarray:
    """Independent float64 references for ``fused_dense``'s activations (none, relu, gelu, gelu_tanh, silu,
    sigmoid, tanh)."""
    import math

    v = np.asarray(v, dtype="float64")
    erf = np.vectorize(math.erf)
    return {
        "none": lambda: v,
        "relu": lambda: np.maximum(v, 0),
        "gelu": lambda: 0.5 * v * (1 + erf(v / math.sqrt(2))),
        "gelu_tanh": lambda: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))),
        "silu": lambda: v / (1 + np.exp(-v)),
        "sigmoid": lambda: 1 / (1 + np.exp(-v)),
        "tanh": lambda: np.tanh(v),
    }[act]()
