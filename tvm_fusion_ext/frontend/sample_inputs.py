"""Valid sample inputs for an ONNX encoder, keyed by ONNX input name."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from ..errors import InputError, ModelLoadError


def padding_mask(batch: int, seq: int) -> np.ndarray:
    # A few trailing padding positions (not all: a fully masked row is a degenerate case of its own).
    m = np.ones((batch, seq), np.int64)
    pad = min(max(seq // 8, 1), seq - 1)
    if pad > 0:
        m[:, seq - pad:] = 0
    return m


def vocab_size(graph, input_name: str) -> int | None:
    """Rows of the embedding table gathered by ``input_name`` (looking through Cast/Identity), if any."""
    inits = {t.name: t for t in graph.initializer}
    consts = {n.output[0]: n for n in graph.node if n.op_type == "Constant"}
    names = {input_name}
    changed = True
    while changed:  # follow dtype casts: some exports Cast ids to int32 before the Gather
        changed = False
        for n in graph.node:
            if n.op_type in ("Cast", "Identity") and n.input and n.input[0] in names and n.output[0] not in names:
                names.add(n.output[0])
                changed = True
    sizes = []
    for n in graph.node:
        if n.op_type == "Gather" and len(n.input) == 2 and n.input[1] in names:
            table = n.input[0]
            if table in inits and len(inits[table].dims) >= 1:
                sizes.append(int(inits[table].dims[0]))
            elif table in consts:
                for a in consts[table].attribute:
                    if a.name == "value" and len(a.t.dims) >= 1:
                        sizes.append(int(a.t.dims[0]))
    return min(sizes) if sizes else None


def sample_inputs(model_or_path, seq: int | None = None, batch: int | None = None, seed: int = 0,
                  shapes: Mapping[str, list[int]] | None = None) -> dict[str, np.ndarray]:
    """Valid inputs for an encoder (ONNX path or ``ModelProto``), keyed by ONNX input name.

    Token ids are drawn from ``[0, vocab)`` where ``vocab`` is the size of the embedding table the ids are
    gathered from (2 when it cannot be found, which is valid for any table). ``*mask*`` inputs are ones with a few
    trailing zeros, ``token_type``/``segment`` inputs zeros, ``position*`` inputs ``arange``. ``batch``/``seq``
    (or ``shapes``) fill or override dims 0 and 1; a dynamic dim with neither raises :class:`InputError`.
    """
    import onnx

    if isinstance(model_or_path, onnx.ModelProto):
        proto, label = model_or_path, "model"
    else:
        path = os.fspath(model_or_path)
        if not os.path.isfile(path):
            raise ModelLoadError(f"{path}: no such file")
        try:
            proto = onnx.load(path, load_external_data=False)  # only names, shapes and table sizes are needed
        except Exception as err:
            raise ModelLoadError(f"{path}: not a readable ONNX model ({type(err).__name__})") from None
        label = path
    graph = proto.graph
    inits = {t.name for t in graph.initializer}
    rng = np.random.default_rng(seed)
    out = {}
    for vi in graph.input:
        if vi.name in inits:
            continue
        name, tt = vi.name, vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim]
        if shapes and name in shapes:
            dims = [int(d) for d in shapes[name]]
        else:
            for axis, val in ((0, batch), (1, seq)):
                if val is not None and len(dims) > axis:
                    dims[axis] = int(val)
        for k, d in enumerate(dims):
            if d is None:
                raise InputError(f"{label}: input {name!r} dim {k} is dynamic; pass seq=/batch= or shapes=")
        shape = tuple(dims)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        low = name.lower()
        if np.issubdtype(dtype, np.floating):
            out[name] = rng.standard_normal(shape).astype(dtype)
        elif "mask" in low:
            b = shape[0] if len(shape) >= 1 else 1
            s = shape[-1] if len(shape) >= 1 else 1
            out[name] = np.broadcast_to(padding_mask(b, s).reshape((b,) + (1,) * max(len(shape) - 2, 0) + (s,)),
                                        shape).astype(dtype) if len(shape) >= 2 else np.ones(shape, dtype)
        elif "token_type" in low or "segment" in low:
            out[name] = np.zeros(shape, dtype)
        elif "position" in low and len(shape) >= 1:
            out[name] = np.broadcast_to(np.arange(shape[-1]), shape).astype(dtype)
        elif dtype == np.bool_:
            out[name] = np.ones(shape, dtype)
        else:
            vocab = vocab_size(graph, name) or 2
            out[name] = rng.integers(0, vocab, size=shape).astype(dtype)
    return out

