"""The weights file of an artifact: tensors back to back, raw, each starting on a 64-byte boundary.

Its index (name, dtype, shape, offset, bytes per tensor, in ``main``'s parameter order) lives in the manifest.
On CPU the loader hands TVM views of one buffer holding the whole file (DLPack, no copy), either

* **2 MiB pages** (``huge``, the default where Linux's transparent huge pages allow it): the file is read into an
  anonymous mapping aligned to 2 MiB and advised ``MADV_HUGEPAGE``. A call that streams MiniLM's 42 MB of
  projection weights touches about 10,000 pages of 4 KiB, several times what the TLB holds, every call; on
  2 MiB pages it is about 20. Costs a read of the file at load (MiniLM's 90 MB: tens of ms) and memory of
  the process's own; or
* **the file mapping** (``file``): a private memory mapping of the file; pages come in on first use and are
  shared between processes through the page cache (MiniLM "loads" in about a millisecond). Used where huge
  pages are unavailable, for weights under one huge page, and for weights over half the available memory.

64 bytes is TVM's allocation alignment, which its kernels may assume for vector loads; both buffers start on a
page boundary, so every tensor keeps its 64-byte offset's alignment.
"""

from __future__ import annotations

import mmap
import os
from typing import BinaryIO, List, Optional, Sequence, Tuple

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


HUGE_PAGE = 2 << 20
#: ``load(weight_pages=...)`` and the environment variable ``TFX_WEIGHT_PAGES`` take one of these
WEIGHT_PAGES = ("auto", "huge", "file")
WEIGHT_PAGES_ENV = "TFX_WEIGHT_PAGES"
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_pages_available() -> bool:
    """Whether this kernel backs an ``MADV_HUGEPAGE`` anonymous mapping with 2 MiB pages (THP ``always`` or
    ``madvise``)."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open(_THP_SETTING) as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def _available_memory() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_weight_pages(value: str, name: str = "weight_pages") -> str:
    """``value`` if it is one of :data:`WEIGHT_PAGES`, else a ValueError naming ``name``."""
    if value not in WEIGHT_PAGES:
        raise ValueError(f"{name} must be one of {', '.join(WEIGHT_PAGES)}, got {value!r}")
    return value


def weight_pages_for(requested: str, nbytes: int) -> str:
    """``"huge"`` or ``"file"``: what backs ``nbytes`` of CPU weights under the policy ``requested`` (one of
    :data:`WEIGHT_PAGES`; ``"auto"`` defers to ``TFX_WEIGHT_PAGES``, then decides). ``"huge"`` needs transparent
    huge pages; ``"auto"`` also keeps the file mapping for weights under one huge page (nothing to gain) or
    over half the available memory (a second copy beside the page cache; the file mapping pages lazily)."""
    check_weight_pages(requested)
    if requested == "auto":
        requested = check_weight_pages(os.environ.get(WEIGHT_PAGES_ENV) or "auto", WEIGHT_PAGES_ENV)
    if requested == "file" or not huge_pages_available():
        return "file"
    if requested == "auto":
        available = _available_memory()
        if nbytes < HUGE_PAGE or (available is not None and nbytes > available // 2):
            return "file"
    return "huge"


def read_into_huge_pages(file: str) -> np.ndarray:
    """The whole file as bytes in an anonymous mapping that starts on a 2 MiB boundary, advised
    ``MADV_HUGEPAGE`` before it is touched (so the first write faults in huge pages). The mapping lives as long
    as any view of the returned array."""
    size = os.path.getsize(file)
    if size == 0:
        return np.zeros(0, np.uint8)
    span = -(-size // HUGE_PAGE) * HUGE_PAGE
    anonymous = mmap.mmap(-1, span + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(anonymous, dtype=np.uint8)
    start = -whole.ctypes.data % HUGE_PAGE
    try:
        anonymous.madvise(mmap.MADV_HUGEPAGE, start, span)
    except OSError:  # THP switched off since the check: the same buffer on small pages
        pass
    buffer = whole[start:start + size]
    with open(file, "rb") as f:
        read = f.readinto(memoryview(buffer))
    if read != size:
        raise ValueError(f"read {read} of its {size} bytes")
    return buffer


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


def cpu_views(arrays: Sequence[np.ndarray]) -> Optional[list]:
    """Zero-copy TVM tensors over host ``arrays`` (DLPack), or None where this numpy cannot export them."""
    import tvm

    try:
        return [_empty(a) if a.size == 0 else _bf16_view(a) if a.dtype.name == "bfloat16"
                else tvm.runtime.from_dlpack(a) for a in arrays]
    except (TypeError, ValueError, BufferError, RuntimeError):  # an exotic numpy
        return None


def _empty(array: np.ndarray):
    """A tensor with no elements (a first decode step's past of length 0): numpy versions export such an array's
    strides differently (some all zeros), and a kernel's argument check wants the compact strides of its shape."""
    import tvm

    return tvm.runtime.empty(array.shape, array.dtype.name, tvm.cpu())


def _bf16_view(array: np.ndarray):
    """A bfloat16 weight (``--precision bf16``; ml_dtypes' numpy dtype, which numpy's DLPack export refuses) as a
    zero-copy view: its bits exported as uint16, the TVM tensor viewed back as bfloat16."""
    import tvm

    return tvm.runtime.from_dlpack(array.view(np.uint16))._create_view(array.shape, "bfloat16")


def to_device(arrays: Sequence[np.ndarray], device) -> list:
    """TVM tensors for ``arrays`` on ``device``: zero-copy views on CPU, copies elsewhere."""
    import tvm

    tensors = cpu_views(arrays) if on_cpu(device) else None
    if tensors is not None:
        return tensors
    return [tvm.runtime.tensor(np.ascontiguousarray(a), device) for a in arrays]
