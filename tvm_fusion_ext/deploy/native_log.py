"""What TVM's C++ logger writes while a call runs: it bypasses ``sys.stderr`` and writes to file descriptor 2, so
the call runs with that descriptor captured, known noise is dropped, and every other line is passed through."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from typing import Iterable, List

#: what TVM 0.27's runtime logs, once per constant, loading a library whose constants carry a memory scope (the
#: int8 and bf16 builds' packed weights): a debugging line with nothing for a user to act on
SCOPE_LOADED = "Warning: Scope Loaded:"


@contextlib.contextmanager
def captured_stderr():
    """File descriptor 2 redirected to a temporary file; yields the list the captured lines are put in when the
    block ends."""
    lines: List[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode(errors="replace").splitlines())


@contextlib.contextmanager
def dropping(noise: Iterable[str]):
    """Run the block with fd 2 captured; lines containing any of ``noise`` are dropped, the rest written to
    ``sys.stderr`` when it ends. Yields the list of dropped lines."""
    noise = tuple(noise)
    dropped: List[str] = []
    with captured_stderr() as lines:
        yield dropped
    kept = []
    for line in lines:
        (dropped if any(n in line for n in noise) else kept).append(line)
    if kept:
        sys.stderr.write("\n".join(kept) + "\n")
