"""A model's I/O contract at run time: inputs by ONNX name checked against their specs, outputs flattened.

Used by the in-process :class:`~tvm_fusion_ext.runtime.CompiledModel` and by loaded artifacts alike; needs
numpy only."""

from __future__ import annotations

from typing import Dict, List, Mapping

import numpy as np

from ..errors import InputError


def check_inputs(specs: Dict[str, tuple], inputs: Mapping[str, np.ndarray], label: str = "model") -> List[np.ndarray]:
    """Arrays in parameter order, or an InputError naming the first problem (before anything is built or run).

    ``specs`` maps each input name to ``(shape, dtype)``."""
    unknown = [n for n in inputs if n not in specs]  # first: a misspelt name explains the missing one
    if unknown:
        raise InputError(f"{label}: unknown input '{unknown[0]}' (expected {list(specs)})")
    missing = [n for n in specs if n not in inputs]
    if missing:
        raise InputError(f"{label}: missing input '{missing[0]}' (expected {list(specs)})")
    arrays = []
    for name, (shape, dtype) in specs.items():
        a = np.asarray(inputs[name])
        if tuple(a.shape) != tuple(shape):
            raise InputError(f"{label}: input '{name}' has shape {list(a.shape)}, the model was built for {list(shape)}")
        if str(a.dtype) != dtype:
            raise InputError(f"{label}: input '{name}' has dtype {a.dtype}, expected {dtype}")
        arrays.append(np.ascontiguousarray(a).reshape(a.shape))  # 0-d stays 0-d
    return arrays


def flatten_outputs(result) -> List[np.ndarray]:
    """The VM's result (a tensor or nested tuples of them) as a flat list of numpy arrays, in output order."""
    if hasattr(result, "numpy"):
        return [result.numpy()]
    out = []
    for r in result:
        out.extend(flatten_outputs(r))
    return out
