"""The run-time side of an in-place KV-cache build (``kv_cache="inplace"``, :mod:`~tvm_fusion_ext.compile.kv_cache`):
the step checks that keep its writes and reads inside the buffers. Numpy only (runtime-only TVM).

Such a model takes each past input as a buffer of ``capacity`` positions and ``past_length`` (int64 ``[1]``), the
positions already filled; a step of ``new`` tokens writes positions ``[past_length, past_length + new)`` and its
mask covers ``past_length + new`` positions. A step that would pass the capacity, or whose mask disagrees with
``past_length``, is refused here in one line before it runs.
"""

from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from ..errors import InputError


def is_inplace(kv_cache: Optional[Mapping]) -> bool:
    return bool(kv_cache) and kv_cache.get("mode") == "inplace"


def check_cache_step(kv_cache: Optional[Mapping], inputs: Mapping[str, np.ndarray], label: str = "model") -> None:
    """Refuse (InputError, one line) an in-place step whose ``past_length`` and new tokens do not fit the
    buffers' capacity, or do not agree with the attention mask's length; nothing for a ``concat`` model."""
    if not is_inplace(kv_cache):
        return
    name, capacity = kv_cache["length_input"], int(kv_cache["capacity"])
    if name not in inputs:
        return  # check_inputs names the missing input
    value = np.asarray(inputs[name])
    if value.shape != (1,) or not np.issubdtype(value.dtype, np.integer):
        raise InputError(f"{label}: input '{name}' must be an int64 array of shape [1] (the cached positions), got "
                         f"{value.dtype} {list(value.shape)}")
    past = int(value[0])
    ids = next((inputs[n] for n in inputs if "input_ids" in n), None)
    mask = next((inputs[n] for n in inputs if "mask" in n.lower()), None)
    new = np.asarray(ids).shape[-1] if ids is not None else None
    if past < 0:
        raise InputError(f"{label}: {name} is {past}; it counts cached positions (>= 0)")
    if new is not None and past + new > capacity:
        raise InputError(f"{label}: {name} {past} + {new} new tokens = {past + new} positions, past the KV cache's "
                         f"capacity of {capacity} (compile with a larger --max-shape for the past dim)")
    if mask is not None and new is not None and np.asarray(mask).shape[-1] != past + new:
        raise InputError(f"{label}: the attention mask covers {np.asarray(mask).shape[-1]} positions, but {name} "
                         f"{past} + {new} new tokens = {past + new}")


def exported_specs(kv_cache: Mapping, specs: Mapping[str, tuple]) -> dict:
    """The exported model's ``{input: (shape, dtype)}`` behind an in-place model's: past inputs with their
    symbolic past dim again, ``past_length`` gone (what decode-step tools and ONNX Runtime feed)."""
    past, length = set(kv_cache["past_inputs"]), kv_cache["length_input"]
    dim = kv_cache.get("past_dim") or "past_sequence_length"
    return {n: ((*shape[:2], dim, *shape[3:]) if n in past else tuple(shape), dtype)
            for n, (shape, dtype) in specs.items() if n != length}


def inplace_feeds(kv_cache: Mapping, feeds: Mapping[str, np.ndarray]) -> dict:
    """The exported model's step inputs (pasts of ``P`` positions) as an in-place model takes them: each past
    copied into the prefix of a zeroed buffer of the capacity, ``past_length = [P]``."""
    past, capacity = set(kv_cache["past_inputs"]), int(kv_cache["capacity"])
    out, length = {}, 0
    for name, value in feeds.items():
        if name in past:
            value = np.asarray(value)
            length = value.shape[2]
            buf = np.zeros((*value.shape[:2], capacity, *value.shape[3:]), value.dtype)
            buf[:, :, :length] = value
            value = buf
        out[name] = value
    out[kv_cache["length_input"]] = np.array([length], np.int64)
    return out


def exported_outputs(kv_cache: Mapping, outputs: Mapping[str, np.ndarray], keys: int) -> dict:
    """An in-place step's outputs as the exported model returns them: each ``present`` cut to its ``keys``
    filled positions."""
    return {n: (np.asarray(v)[:, :, :keys] if "present" in n and np.ndim(v) == 4 else v) for n, v in outputs.items()}
