"""What travels: the campaign's libraries gzipped here, unpacked there before the parts run (standard library only).

An exported library is mostly its embedded device module (the CUDA source and the fatbin's SASS), which gzip shrinks
15-40×: the numerics part's 10 MiB of libraries carry as well under 1 MiB, and unpacking all of a campaign takes well
under a second there. ``run`` unpacks what it finds, so a campaign built before libraries were packed still runs.
"""

from __future__ import annotations

import gzip
import shutil
import time
from pathlib import Path


def pack(part_dir: Path) -> None:
    """Every ``*.so`` under ``part_dir`` replaced by ``*.so.gz``."""
    for lib in sorted(part_dir.rglob("*.so")):
        with open(lib, "rb") as src, gzip.open(f"{lib}.gz", "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        lib.unlink()


def unpack(part_dir: Path) -> float:
    """Every ``*.so.gz`` under ``part_dir`` unpacked beside itself (kept, so that a rerun finds it); the seconds
    it took."""
    start = time.time()
    for packed in sorted(part_dir.rglob("*.so.gz")):
        lib = packed.with_suffix("")
        if lib.is_file() and lib.stat().st_mtime >= packed.stat().st_mtime:
            continue
        with gzip.open(packed, "rb") as src, open(lib, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return time.time() - start
