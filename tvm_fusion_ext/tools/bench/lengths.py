"""Variable-length batches for ``tvm-fusion bench --lengths MIN-MAX``: what a server sees with mixed requests.

Each sequence's length is drawn uniformly from ``[MIN, MAX]`` with ``numpy.random.default_rng(seed)``; the batch
is padded to the longest with ``attention_mask`` zeros, and every runtime runs on that same padded batch.
Outputs are compared at valid positions only: what a runtime leaves at padded positions is unspecified (torch
and ORT leave values there, a padding-free build of ours writes zeros).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...errors import InputError

MASK_INPUT = "attention_mask"


def parse_lengths(text: Optional[str]) -> Optional[Tuple[int, int]]:
    """``"16-128"`` → ``(16, 128)``; None stays None."""
    if text is None:
        return None
    parts = str(text).split("-")
    try:
        lo, hi = (int(parts[0]), int(parts[1])) if len(parts) == 2 else (None, None)
    except ValueError:
        lo = hi = None
    if lo is None or lo <= 0 or hi < lo:
        raise InputError(f"--lengths: expected MIN-MAX with 0 < MIN <= MAX, e.g. 16-128, got '{text}'")
    return lo, hi


def draw_lengths(bounds: Tuple[int, int], batch: int, seed: int = 0) -> List[int]:
    lo, hi = bounds
    return [int(n) for n in np.random.default_rng(seed).integers(lo, hi + 1, size=batch)]


def apply_lengths(feeds: Dict[str, np.ndarray], lengths: Sequence[int], label: str) -> Dict[str, np.ndarray]:
    """``feeds`` with ``attention_mask`` set to ones over each sequence's length, zeros after it."""
    if MASK_INPUT not in feeds:
        raise InputError(f"{label}: --lengths needs an '{MASK_INPUT}' input (inputs: {', '.join(feeds)})")
    batch, seq = feeds[MASK_INPUT].shape[:2]
    if len(lengths) != batch or max(lengths) > seq:
        raise InputError(f"{label}: {len(lengths)} lengths up to {max(lengths)} do not fit a [{batch}, {seq}] batch")
    mask = (np.arange(seq)[None, :] < np.asarray(lengths)[:, None]).astype(feeds[MASK_INPUT].dtype)
    return dict(feeds, **{MASK_INPUT: mask})


def valid_positions(outputs: Sequence[np.ndarray], mask: Optional[np.ndarray]) -> List[np.ndarray]:
    """Each output's rows at valid (b, s) positions, for outputs laid out [batch, seq, ...]; others whole."""
    if mask is None:
        return [np.asarray(o) for o in outputs]
    valid = np.asarray(mask).astype(bool)
    return [np.asarray(o)[valid] if np.ndim(o) >= 2 and np.shape(o)[:2] == valid.shape else np.asarray(o)
            for o in outputs]
