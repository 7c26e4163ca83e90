"""Atomic file writes: a temp file in the same directory, fsync, rename. Readers (and a crash at any moment)
see either the old file or the new one, never a partial one."""

from __future__ import annotations

import os
import tempfile
from typing import Callable


def atomic_write(path: str, write: Callable, binary: bool = False) -> None:
    """Call ``write(f)`` on a temporary file, then move it over ``path``."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.splitext(path)[1], dir=directory)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data), binary=True)


def human_size(n: int) -> str:
    """A byte count as people read it: ``90.3 MiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
