"""A model's I/O contract at run time: inputs by ONNX name checked against their specs, outputs flattened.

Used by the in-process :class:`~tvm_fusion_ext.runtime.CompiledModel` and by loaded artifacts alike; needs
numpy only."""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from ..errors import InputError


def check_inputs(specs: Dict[str, tuple], inputs: Mapping[str, np.ndarray], label: str = "model",
                 bounds: Optional[Mapping[str, Tuple[int, Optional[int]]]] = None) -> List[np.ndarray]:
    """Arrays in parameter order, or an InputError naming the first problem (before anything is built or run).

    ``specs`` maps each input name to ``(shape, dtype)``; a dim is an int, or the name of a symbolic dim
    (``"seq"``): inputs sharing a name must agree on its value, which must lie within ``bounds[name]``
    (``(lower, upper or None)``; lower 1 and no upper bound when not given). A model compiled for a bound
    plans its memory for it, so a larger value is refused here rather than overrunning a buffer."""
    unknown = [n for n in inputs if n not in specs]  # first: a misspelt name explains the missing one
    if unknown:
        raise InputError(f"{label}: unknown input '{unknown[0]}' (expected {list(specs)})")
    missing = [n for n in specs if n not in inputs]
    if missing:
        raise InputError(f"{label}: missing input '{missing[0]}' (expected {list(specs)})")
    bounds = bounds or {}
    seen: Dict[str, Tuple[int, str]] = {}  # dim name -> (value, the input that set it)
    arrays = []
    for name, (shape, dtype) in specs.items():
        a = np.asarray(inputs[name])
        if a.ndim != len(shape) or any(isinstance(d, int) and d != g for g, d in zip(a.shape, shape)):
            raise InputError(f"{label}: input '{name}' has shape {list(a.shape)}, the model was built for "
                             f"{_show(shape)}")
        for axis, (got, dim) in enumerate(zip(a.shape, shape)):
            if isinstance(dim, str) and dim.isidentifier():  # (an expression such as "n * 2": the VM checks it)
                _check_dim(label, name, axis, dim, int(got), bounds.get(dim), seen)
        if str(a.dtype) != dtype:
            raise InputError(f"{label}: input '{name}' has dtype {a.dtype}, expected {dtype}")
        arrays.append(np.ascontiguousarray(a).reshape(a.shape))  # 0-d stays 0-d
    return arrays


def _check_dim(label, name, axis, dim, got, bound, seen) -> None:
    lower, upper = bound if bound is not None else (1, None)
    where = f"{label}: input '{name}' dim {axis} ('{dim}') is {got}"
    if got < lower:
        raise InputError(f"{where}, below its lower bound {lower}")
    if upper is not None and got > upper:
        raise InputError(f"{where}, above its upper bound {upper} (the model was compiled for {dim} <= {upper}; "
                         f"recompile with a larger --max-shape)")
    if dim in seen and seen[dim][0] != got:
        raise InputError(f"{where}, but input '{seen[dim][1]}' has {dim} = {seen[dim][0]} (inputs sharing a dim "
                         f"must agree)")
    seen.setdefault(dim, (got, name))


def _show(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def flatten_outputs(result) -> List[np.ndarray]:
    """The VM's result (a tensor or nested tuples of them) as a flat list of numpy arrays, in output order."""
    if hasattr(result, "numpy"):
        return [result.numpy()]
    out = []
    for r in result:
        out.extend(flatten_outputs(r))
    return out
