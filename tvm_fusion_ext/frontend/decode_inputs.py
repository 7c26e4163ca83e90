"""One decode step's inputs for a KV-cache decoder, from the model's own input names and layouts.

A decode step feeds one new token per sequence against a cache of ``past`` tokens. Each input is recognised by
its name and rank, as Optimum's and torch's exports name them:

==================  ==========================================================================================
token ids           ``*input_ids*`` (integer, 2-D): ``[batch, 1]``, drawn from the embedding table's rows
mask                ``*mask*`` (integer or bool, 2-D): ``[batch, past + 1]`` of ones
positions           ``*position*`` (integer, 2-D): ``[batch, 1]`` holding ``past``
cache position      ``cache_position`` (1-D): ``[past]``
cache branch        ``use_cache_branch`` (bool): true (a merged decoder's cache branch)
past keys/values    ``*past*`` (floating, rank >= 3): the leading symbolic dim is the batch, the other
                    symbolic one the past length; static dims (heads, head size) as the model declares them
==================  ==========================================================================================

Anything else (or a past tensor with more than two symbolic dims) is refused in one line naming the input.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import InputError

IDS, MASK, POSITIONS, CACHE_POSITION, BRANCH, PAST = "ids", "mask", "positions", "cache_position", "branch", "past"


def role_of(name: str, shape: Sequence, dtype: str) -> Optional[str]:
    """Which decode input ``name`` is (one of the constants above), or None."""
    low, rank, floating = name.lower(), len(shape), np.issubdtype(np.dtype(dtype), np.floating)
    if "past" in low and floating and rank >= 3:
        return PAST
    if low == "use_cache_branch":
        return BRANCH
    if low == "cache_position" and rank == 1:
        return CACHE_POSITION
    if floating or rank != 2:
        return None
    if "input_ids" in low:
        return IDS
    if "mask" in low:
        return MASK
    if "position" in low:
        return POSITIONS
    return None


def decode_shapes(specs: Dict[str, Tuple[Sequence, str]], batch: int, past: int,
                  label: str, new: int = 1) -> Dict[str, List[int]]:
    """``{input: shape}`` of one decode step (``new`` tokens per row; more than one: a prefill or a chunk);
    ``specs`` is ``{input: (dims, dtype)}``, each dim an int or a name (symbolic)."""
    shapes = {}
    for name, (dims, dtype) in specs.items():
        role = role_of(name, dims, dtype)
        if role is None:
            raise InputError(f"{label}: input '{name}' {_show(dims)} is not one a decode step knows how to fill "
                             f"(token ids, mask, positions, past keys/values); pass --inputs X.npz instead")
        if role in (IDS, POSITIONS):
            wanted = [batch, new]
        elif role == MASK:
            wanted = [batch, past + new]
        elif role == CACHE_POSITION:
            wanted = [new]
        elif role == BRANCH:
            wanted = [int(d) if isinstance(d, int) else 1 for d in dims]
        else:
            lengths = [k for k, d in enumerate(dims) if k > 0 and not isinstance(d, int)]
            if len(lengths) != 1:
                why = "a static past length" if not lengths else f"{len(lengths)} symbolic dims besides the batch"
                raise InputError(f"{label}: past input '{name}' {_show(dims)} has {why}; a decode step needs "
                                 f"one symbolic past length")
            wanted = list(dims)
            wanted[0], wanted[lengths[0]] = batch, past
        for k, (d, w) in enumerate(zip(dims, wanted)):
            if isinstance(d, int) and d != w:
                what = "--batch" if k == 0 else "--past"
                raise InputError(f"{label}: input '{name}' has static dim {k} = {d}; {what} asks for {w}")
        shapes[name] = wanted
    return shapes


def decode_feeds(specs: Dict[str, Tuple[Sequence, str]], shapes: Dict[str, List[int]], past: int,
                 vocab: Optional[int] = None, seed: int = 0) -> Dict[str, np.ndarray]:
    """The arrays of one decode step: random token ids below ``vocab`` (2 when unknown), a mask of ones,
    positions from ``past`` on, past keys/values from a standard normal."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, (dims, dtype) in specs.items():
        role, shape = role_of(name, dims, dtype), tuple(shapes[name])
        if role == IDS:
            x = rng.integers(0, vocab or 2, size=shape)
        elif role == MASK or role == BRANCH:
            x = np.ones(shape)
        elif role in (POSITIONS, CACHE_POSITION):
            x = np.broadcast_to(np.arange(past, past + shape[-1]), shape)
        else:
            x = rng.standard_normal(shape)
        feeds[name] = x.astype(dtype)
    return feeds


def vocab_of(onnx_path: Optional[str], specs: Dict[str, Tuple[Sequence, str]]) -> Optional[int]:
    """Rows of the embedding table the token ids index, when the file shows it (None: ids below 2 are safe)."""
    if onnx_path is None:
        return None
    import onnx

    from .sample_inputs import vocab_size

    ids = next((n for n, (d, t) in specs.items() if role_of(n, d, t) == IDS), None)
    return vocab_size(onnx.load(onnx_path, load_external_data=False).graph, ids) if ids else None


def past_bytes(specs: Dict[str, Tuple[Sequence, str]], feeds: Dict[str, np.ndarray]) -> int:
    """Bytes of the cached keys and values a step reads (its past inputs)."""
    return sum(int(feeds[n].nbytes) for n, (dims, dtype) in specs.items() if role_of(n, dims, dtype) == PAST)


def onnx_specs(path: str) -> Dict[str, Tuple[list, str]]:
    """``{input: (dims, dtype)}`` of an ONNX file's graph inputs (initializers excluded)."""
    import onnx
    from onnx import helper

    proto = onnx.load(path, load_external_data=False)
    inits = {t.name for t in proto.graph.initializer}
    specs = {}
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or f"{vi.name}_dim{k}")
                for k, d in enumerate(tt.shape.dim)]
        specs[vi.name] = (dims, str(helper.tensor_dtype_to_np_dtype(tt.elem_type)))
    return specs


def _show(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"
