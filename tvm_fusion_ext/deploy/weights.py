"""The weights file of an artifact: tensors back to back, raw, each starting on a 64-byte boundary.

Its index (name, dtype, shape, offset, bytes per tensor, in ``main``'s parameter order) lives in the manifest.
On CPU the loader memory-maps the file and hands TVM views of the mapping (DLPack, no copy): MiniLM's 90 MB
"load" in about a millisecond and pages come in on first use, shared between processes through the page
cache. 64 bytes is TVM's allocation alignment, which its kernels may assume for vector loads.
"""

from __future__ import annotations

import os
from typing import BinaryIO, List, Sequence, Tuple

import numpy as np

ALIGNMENT = 64


def write_weights(f: BinaryIO, tensors: Sequence[Tuple[str, np.ndarray]]) -> List[dict]:
    """Write ``tensors`` to ``f``; returns their index entries."""
    index, offset = [], 0
    for name, value in tensors:
        array = np.ascontiguousarray(value)
        pad = -offset % ALIGNMENT
        f.write(b"\0" * pad)
        offset += pad
        index.append({"name": name, "dtype": str(array.dtype), "shape": [int(d) for d in array.shape],
                      "offset": offset, "bytes": int(array.nbytes)})
        f.write(array.tobytes())
        offset += array.nbytes
    return index


def map_weights(file: str) -> np.ndarray:
    """The whole file as a private (copy-on-write) memory mapping of bytes: what the views below point into."""
    if os.path.getsize(file) == 0:
        return np.zeros(0, np.uint8)  # mmap refuses empty files
    return np.memmap(file, dtype=np.uint8, mode="c")


def views(mapping: np.ndarray, index: Sequence[dict]) -> List[np.ndarray]:
    """One numpy view per index entry (no copy). Raises ValueError for an entry outside the mapping or
    misaligned: the caller turns that into an error naming the artifact."""
    out = []
    for entry in index:
        start, nbytes = int(entry["offset"]), int(entry["bytes"])
        dtype, shape = np.dtype(entry["dtype"]), tuple(int(d) for d in entry["shape"])
        if start % ALIGNMENT or start < 0 or start + nbytes > mapping.size:
            raise ValueError(f"tensor {entry['name']!r} at [{start}, {start + nbytes}) is outside the file or not "
                             f"{ALIGNMENT}-byte aligned")
        if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != nbytes:
            raise ValueError(f"tensor {entry['name']!r}: {nbytes} bytes do not hold {dtype}{list(shape)}")
        out.append(mapping[start:start + nbytes].view(dtype).reshape(shape))
    return out


def on_cpu(device) -> bool:
    import tvm

    return device.dlpack_device_type() == tvm.cpu().dlpack_device_type()


def to_device(arrays: Sequence[np.ndarray], device) -> list:
    """TVM tensors for ``arrays`` on ``device``: zero-copy views on CPU, copies elsewhere."""
    import tvm

    if on_cpu(device):
        try:
            return [tvm.runtime.from_dlpack(a) for a in arrays]
        except (TypeError, ValueError, BufferError, RuntimeError):  # an exotic numpy: copy instead
            pass
    return [tvm.runtime.tensor(np.ascontiguousarray(a), device) for a in arrays]
