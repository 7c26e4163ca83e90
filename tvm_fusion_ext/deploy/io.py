"""A model's I/O contract at run time: inputs by ONNX name checked against their specs, outputs flattened.

Used by the in-process :class:`~tvm_fusion_ext.runtime.CompiledModel` and by loaded artifacts alike; needs
numpy (and ``tvm.runtime`` to make tensors)."""

from __future__ import annotations

import re
import threading
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..errors import InputError


def check_inputs(specs: Dict[str, tuple], inputs: Mapping[str, np.ndarray], label: str = "model",
                 bounds: Optional[Mapping[str, Tuple[int, int]]] = None,
                 reasons: Optional[Mapping[str, Mapping[str, str]]] = None) -> List[np.ndarray]:
    """Arrays in parameter order, or an InputError naming the first problem (before anything is built or run).

    ``specs`` maps each input name to ``(shape, dtype)``; a dim of ``shape`` is an ``int`` (static) or the name of
    a symbolic dim, which must take the same value in every input and lie within ``bounds[name]``
    (``(lower, upper)``, inclusive). ``reasons[name]["upper"|"lower"]``, where known, says where a bound came
    from; the error for a dim past it quotes that (a default is raised with ``--max-shape``, a size the export
    fixed is not)."""
    unknown = [n for n in inputs if n not in specs]  # first: a misspelt name explains the missing one
    if unknown:
        raise InputError(f"{label}: unknown input '{unknown[0]}' (expected {list(specs)})")
    missing = [n for n in specs if n not in inputs]
    if missing:
        raise InputError(f"{label}: missing input '{missing[0]}' (expected {list(specs)})")
    bounds = bounds or {}
    seen: Dict[str, Tuple[int, str]] = {}  # dim name -> (value, the input that fixed it)
    arrays = []
    for name, (shape, dtype) in specs.items():
        a = np.asarray(inputs[name])
        if a.ndim != len(shape) or any(isinstance(d, int) and d != n for d, n in zip(shape, a.shape)):
            raise InputError(f"{label}: input '{name}' has shape {list(a.shape)}, the model was built for "
                             f"{list(shape)}")
        for axis, (d, n) in enumerate(zip(shape, a.shape)):
            if isinstance(d, int):
                continue
            if d in seen and seen[d][0] != n:
                raise InputError(f"{label}: input '{name}' dim {axis} ({d}) is {n}, but input '{seen[d][1]}' has "
                                 f"{d} = {seen[d][0]}")
            seen.setdefault(d, (int(n), name))
            low, high = bounds.get(d, (1, None))
            if n < low or (high is not None and n > high):
                why = ((reasons or {}).get(d) or {}).get("lower" if n < low else "upper")
                raise InputError(f"{label}: input '{name}' dim {axis} ({d}) is {n}, outside the range the model "
                                 f"was compiled for ({low}..{high})" + (f": {why}" if why else ""))
        if str(a.dtype) != dtype:
            raise InputError(f"{label}: input '{name}' has dtype {a.dtype}, expected {dtype}")
        arrays.append(np.ascontiguousarray(a).reshape(a.shape))  # 0-d stays 0-d
    return arrays


def input_tensors(arrays: Sequence[np.ndarray], device) -> list:
    """Checked inputs as TVM tensors on ``device``. On CPU each is copied once into a private 64-byte aligned buffer
    that its tensor wraps (DLPack, no second copy). MiniLM's three inputs take ~13 µs this way against ~46 through
    ``tvm.runtime.tensor``, which allocates and copies through the runtime (2-core Zen 4): small beside a call, but
    paid on every request. The copy is private, so a caller's array is never read while the model runs."""
    from .weights import on_cpu, to_device

    if not on_cpu(device):
        return to_device(arrays, device)
    return to_device(_aligned_copies(arrays), device)


def _aligned_copies(arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
    from .weights import ALIGNMENT

    copies = []
    for a in arrays:
        buf = np.empty(a.nbytes + ALIGNMENT, np.uint8)
        start = -buf.ctypes.data % ALIGNMENT
        copy = buf[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
        np.copyto(copy, a)
        copies.append(copy)
    return copies


class InputBuffers:
    """The VM's input tensors for each calling thread, kept while its calls bring the same input names, shapes and
    dtypes (a server's steady state), and refilled in place.

    Checking inputs and making tensors for them is a few tens of µs of Python, but it runs right after a call that
    streamed the model's weights through every cache, and measured ~0.25 ms at MiniLM's (1, 16) (one process, calls
    interleaved: ``run`` 2.67 ms against 2.42 for the bare VM call; reused buffers 2.53). A call whose inputs match
    the thread's last checked call in names, order, shapes and dtypes (numpy arrays only) skips the checks, which
    those properties decide, and copies each input into the buffer its tensor wraps; anything else takes the full
    path and becomes the thread's buffers. CPU only (elsewhere a tensor is a device copy, not a view). The copies
    stay private: a caller's array is never read while the model runs, and outputs are copied out (never views of
    these buffers)."""

    def __init__(self, names: Sequence[str], device, check):
        from .weights import on_cpu

        self._names = list(names)  # the inputs in parameter order: the order ``check`` returns them in
        self._device = device
        self._check = check  # inputs -> checked arrays in parameter order (InputError otherwise)
        self._reuse = on_cpu(device)
        self._local = threading.local()

    def tensors(self, inputs: Mapping[str, np.ndarray]) -> list:
        signature = _signature(inputs) if self._reuse else None
        held = getattr(self._local, "held", None)
        if signature is not None and held is not None and held[0] == signature:
            _, copies, tensors = held
            for copy, name in zip(copies, self._names):
                np.copyto(copy, inputs[name])
            return tensors
        arrays = self._check(inputs)
        if not self._reuse:
            return input_tensors(arrays, self._device)
        from .weights import cpu_views, to_device

        copies = _aligned_copies(arrays)
        tensors = cpu_views(copies)  # views: a refill reaches the VM
        if tensors is None:  # copies made by the runtime cannot be refilled: not kept
            return to_device(copies, self._device)
        if signature is not None:
            self._local.held = (signature, copies, tensors)
        return tensors


def _signature(inputs: Mapping[str, np.ndarray]):
    """What decides whether inputs pass the checks: names in order, shapes, dtypes; None unless all are arrays."""
    out = []
    for name, a in inputs.items():
        if type(a) is not np.ndarray:
            return None
        out.append((name, a.shape, a.dtype))
    return tuple(out)


_SHAPE_CHECK = re.compile(r"\((\d+) vs\. (\d+)\).*?ErrorContext\(\w+, ty=R\.Tensor\(\((.*?)\), dtype.*?shape\[(\d+)\] "
                          r"mismatch", re.S)


#: compile/checks/gather_indices.py's run-time count of out-of-range indices is match-cast to the shape
#: ``[0, INDEX_CHECK_TAG, op code, data input + 1, axis, indices input + 1, static dim or 0, data reshaped]``: the tag tells its
#: failure from the VM's other shape checks, the rest names what failed (the op by its code in INDEX_CHECK_OPS)
INDEX_CHECK_TAG = 7734
INDEX_CHECK_OPS = {1: "GatherND", 2: "GatherElements", 3: "ScatterND", 4: "ScatterElements", 5: "Gather"}
_INDEX_CHECK = re.compile(r"\((\d+) vs\. 0\)\s*:\s*ErrorContext\(match_cast, ty=R\.Shape\(\[0, "
                          rf"{INDEX_CHECK_TAG}, (\d+), (\d+), (\d+), (\d+), (\d+), (\d+)\]\)\)")


def index_check_error(err: BaseException, specs: Dict[str, tuple], inputs: Mapping[str, np.ndarray],
                      label: str = "model") -> Optional[InputError]:
    """A gather/scatter bounds check (``compile/checks/gather_indices.py``), failed at run time, as one line naming the
    op and the input at fault where the indices or the data is one; else None."""
    found = _INDEX_CHECK.search(str(err))
    if found is None:
        return None
    count, op, data_at, axis, indices_at, size, reshaped = (int(g) for g in found.groups())
    op_name = INDEX_CHECK_OPS.get(op, "a gather")
    names = list(specs)

    def input_name(at):
        return names[at - 1] if 0 < at <= len(names) and names[at - 1] in inputs else None

    values = f"{count} {'value' if count == 1 else 'values'}"
    if input_name(indices_at):  # the indices are an input: its values are wrong (a token id past the vocabulary)
        span = f"{-size} .. {size - 1}" if size else "the range"
        return InputError(f"{label}: input '{input_name(indices_at)}' holds {values} outside {span}, the indices "
                          f"{op_name} can read along dim {axis} of its data")
    indices = f"{count} {'index' if count == 1 else 'indices'}"
    if input_name(data_at):  # computed indices past an input: its shape does not fit the others'
        name = input_name(data_at)
        where = f"dim {axis} of the model's reshape of it" if reshaped else f"its dim {axis}"
        return InputError(f"{label}: input '{name}' of shape {tuple(np.shape(inputs[name]))} is indexed past "
                          f"{where} by {op_name} ({indices} the model computes from the other inputs): the "
                          f"inputs' shapes do not fit together")
    return InputError(f"{label}: {indices} the model computes for {op_name} fall outside dim {axis} of its data: "
                      f"the inputs' shapes or values do not fit together")


def shape_check_error(err: BaseException, specs: Dict[str, tuple], inputs: Mapping[str, np.ndarray],
                      label: str = "model") -> Optional[InputError]:
    """The VM's own shape check, failed at run time, as one line naming the input dims it relates; else None.

    Inputs whose dims the export names apart can still be tied by the graph (a KV cache's ``past_key`` and
    ``past_value`` lengths, which one attention multiplies over): the model checks such a relation when it
    runs, and TVM's message names only the compiled shape expression."""
    index_error = index_check_error(err, specs, inputs, label)
    if index_error is not None:
        return index_error
    found = _SHAPE_CHECK.search(str(err))
    if found is None:
        return None
    got, expected, shape, axis = found.group(1), found.group(2), found.group(3), found.group(4)
    where: Dict[str, str] = {}
    for name, (dims, _dtype) in specs.items():
        for i, d in enumerate(dims):
            if isinstance(d, str) and d not in where and re.search(rf"\b{re.escape(d)}\b", shape) \
                    and name in inputs and np.ndim(inputs[name]) > i:
                where[d] = f"{d} = {np.shape(inputs[name])[i]} from '{name}' dim {i}"
    given = f" ({', '.join(where.values())})" if where else ""
    shape = _readable_dims(shape)
    return InputError(f"{label}: the inputs' shapes do not fit together: a tensor of shape ({shape}) the model "
                      f"computes has {got} at dim {axis}, where the inputs give {expected}{given}")


def _readable_dims(text: str) -> str:
    """TVM's printing of a shape as a user reads it: ``min(past, 7)``, not ``T.min(past, 7)``; ``INT64_MAX`` (an
    exporter's "to the end" slice bound), not its 19 digits; ``2``, not ``T.int64(2)``."""
    text = re.sub(r"\bT\.u?int(?:8|16|32|64)\((-?\d+)\)", r"\1", text)
    return re.sub(r"\bT\.(min|max)\(", r"\1(", text).replace(str(2**63 - 1), "INT64_MAX")


def call_checked(call, specs: Dict[str, tuple], inputs: Mapping[str, np.ndarray], label: str = "model"):
    """``call()``, with a failed VM shape check raised as :func:`shape_check_error`'s one line."""
    try:
        return call()
    except Exception as err:  # noqa: BLE001  (TVM's errors have no common type; only shape checks are mapped)
        mapped = shape_check_error(err, specs, inputs, label)
        if mapped is None:
            raise
        raise mapped from None


def flatten_outputs(result) -> List[np.ndarray]:
    """The VM's result (a tensor or nested tuples of them) as a flat list of numpy arrays (copies), in output
    order."""
    if hasattr(result, "numpy"):
        return [_copy_out(result)]
    out = []
    for r in result:
        out.extend(flatten_outputs(r))
    return out


def _copy_out(tensor) -> np.ndarray:
    """A numpy copy of a host tensor, made by numpy from a DLPack view: ~0.1 ms less than ``Tensor.numpy()`` right
    after a call has flushed the caches (MiniLM at (1, 16) and (1, 128), one process, interleaved), whose Python
    side queries shape and dtype through the FFI first. Device tensors and dtypes numpy has no DLPack form for
    (bfloat16) take ``numpy()``."""
    try:
        return np.from_dlpack(tensor).copy()
    except (TypeError, ValueError, BufferError, RuntimeError):
        return tensor.numpy()
