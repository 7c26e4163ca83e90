"""Greedy generation over a compiled KV-cache decoder: a prefill, then one step per new token feeding ``present``
back as ``past``. Numpy only: it runs over a loaded artifact (:func:`~tvm_fusion_ext.deploy.load`) where TVM is
runtime-only, or over an in-process :class:`~tvm_fusion_ext.runtime.CompiledModel`.

The decoder is one exported as Optimum (and ONNX Runtime GenAI) export decoders: ``input_ids``,
``attention_mask``, ``position_ids`` (optional), ``past_key_values.{i}.key/value`` ``[batch, kv_heads, past,
head_dim]`` in; ``logits`` and ``present.{i}.key/value`` out. The first call feeds a past of length 0 (the whole
prompt at once); every later call one token per row. Positions follow the mask as transformers' ``generate``
numbers them (a left-padded row's first real token is position 0), so a left-padded batch generates what each
prompt would alone.

A model built with the in-place cache (``kv_cache="inplace"``, :mod:`.kv_cache`) is driven the same way, without
the copies: its past buffers are allocated once on the model's device, at the capacity it was compiled for,
and passed to every step with ``past_length`` (the positions filled); the step writes its keys and values into
them, so its ``present`` outputs (the same buffers) are never read back. The tokens are those of the ``concat``
build. A generation that would pass the capacity is refused at that step.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np

from ..errors import InputError


def generate(model, input_ids, max_new_tokens: int = 16, attention_mask=None,
             eos_token_id: Optional[int] = None, pad_token_id: Optional[int] = None) -> np.ndarray:
    """``[batch, prompt + new]`` token ids: the prompt followed by up to ``max_new_tokens`` greedy tokens
    (the argmax of each step's last logits). ``model`` has ``input_specs``, ``output_names`` and ``run(feeds)``
    (a :class:`~tvm_fusion_ext.deploy.DeployedModel` or a :class:`~tvm_fusion_ext.runtime.CompiledModel`).
    ``attention_mask``: 1 for prompt tokens, 0 for (left) padding; ones when omitted. A row that produced
    ``eos_token_id`` is finished: its later tokens are ``pad_token_id`` (default ``eos_token_id``), and all rows
    finished end the loop early, as transformers' greedy ``generate`` does."""
    ids = np.asarray(input_ids)
    if ids.ndim != 2 or ids.shape[1] == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise InputError(f"generate: input_ids must be a [batch, length >= 1] integer array, got shape {ids.shape} "
                         f"{ids.dtype}")
    if max_new_tokens < 0:
        raise InputError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
    mask = np.ones(ids.shape, np.int64) if attention_mask is None else np.asarray(attention_mask)
    if mask.shape != ids.shape:
        raise InputError(f"generate: attention_mask has shape {mask.shape}, input_ids {ids.shape}")
    io = DecoderIO(model)
    batch = ids.shape[0]
    past = io.empty_past(batch)
    inplace = _InplaceCache(model, io) if io.length is not None else None
    tokens = ids.astype(np.int64)
    step_ids, step_mask = tokens, mask.astype(np.int64)
    positions = np.maximum(np.cumsum(step_mask, axis=1) - 1, 0)
    finished = np.zeros(batch, bool)
    pad = eos_token_id if pad_token_id is None else pad_token_id
    for _ in range(max_new_tokens):
        if inplace is not None:
            logits = inplace.step(io.feeds(step_ids, step_mask, positions, {}),
                                  step_mask.shape[1] - step_ids.shape[1])
        else:
            out = model.run(io.feeds(step_ids, step_mask, positions, past))
            logits = out[io.logits]
        nxt = logits[:, -1, :].argmax(axis=-1).astype(np.int64)
        if eos_token_id is not None:
            nxt = np.where(finished, pad, nxt)
            finished |= nxt == eos_token_id
        tokens = np.concatenate([tokens, nxt[:, None]], axis=1)
        if eos_token_id is not None and finished.all():
            break
        if inplace is None:
            past = {name: out[present] for name, present in io.present_of.items()}
        step_mask = np.concatenate([step_mask, np.ones((batch, 1), np.int64)], axis=1)
        positions = positions[:, -1:] + 1
        step_ids = nxt[:, None]
    return tokens


class DecoderIO:
    """Which of a decoder's inputs and outputs is which: read from their names once."""

    def __init__(self, model):
        specs: Mapping[str, tuple] = model.input_specs
        outputs: Sequence[str] = model.output_names
        self.specs = dict(specs)
        self.ids = _one(specs, lambda n: "input_ids" in n, "input_ids")
        self.mask = _one(specs, lambda n: "mask" in n, "attention_mask")
        self.positions = next((n for n in specs if "position" in n.lower()), None)
        kv = getattr(model, "kv_cache", None) or {}
        #: the in-place cache's length input (``past_length``), None for a model that concatenates its cache
        self.length: Optional[str] = kv.get("length_input") if kv.get("mode") == "inplace" else None
        self.past: List[str] = [n for n in specs if "past" in n.lower() and n != self.length]
        if not self.past:
            raise InputError(f"generate: the model has no past (KV cache) inputs (inputs: {list(specs)})")
        self.logits = next((n for n in outputs if "logits" in n.lower()), outputs[0])
        presents = [n for n in outputs if "present" in n.lower()]
        if len(presents) != len(self.past):
            raise InputError(f"generate: {len(self.past)} past inputs but {len(presents)} present outputs "
                             f"(outputs: {list(outputs)})")
        by_name = {p.replace("past_key_values", "present"): p for p in self.past}
        if set(by_name) == set(presents):
            self.present_of: Dict[str, str] = {p: n for n, p in by_name.items()}
        else:  # names that do not pair up: the export's order does
            self.present_of = dict(zip(self.past, presents))
        others = [n for n in specs if n not in (self.ids, self.mask, self.positions, self.length, *self.past)]
        if others:
            raise InputError(f"generate: input '{others[0]}' is not one a generation step fills (token ids, mask, "
                             f"positions, past keys/values)")

    def empty_past(self, batch: int) -> Dict[str, np.ndarray]:
        """Each past input with 0 cached tokens: its symbolic dim after the batch is the past length."""
        out = {}
        for name in self.past:
            shape, dtype = self.specs[name]
            dims = [batch] + [d if isinstance(d, int) else 0 for d in list(shape)[1:]]
            out[name] = np.zeros(dims, dtype)
        return out

    def feeds(self, ids, mask, positions, past) -> Dict[str, np.ndarray]:
        feeds = {self.ids: ids.astype(self.specs[self.ids][1]), self.mask: mask.astype(self.specs[self.mask][1])}
        if self.positions is not None:
            feeds[self.positions] = positions.astype(self.specs[self.positions][1])
        feeds.update(past)
        return feeds


class _InplaceCache:
    """An in-place cache model's buffers, on its device for the whole generation, and its steps over them."""

    def __init__(self, model, io: DecoderIO):
        self.model, self.io = model, io
        self.names = list(io.specs)
        self.main = None
        self.args: list = []

    def step(self, feeds: Dict[str, np.ndarray], past_length: int) -> np.ndarray:
        """The step's logits; its keys and values are written into the buffers at ``past_length``."""
        from .io import check_inputs, input_tensors
        from .kv_cache import check_cache_step

        io, model = self.io, self.model
        feeds = dict(feeds, **{io.length: np.array([past_length], np.int64)})
        label = getattr(model, "path", None) or getattr(model, "label", "model")
        check_cache_step(model.kv_cache, feeds, label)
        if self.main is None:  # the first step allocates the buffers (zeros) with the weights' tensors
            batch = feeds[io.ids].shape[0]
            full = dict(feeds)
            for name in io.past:
                shape, dtype = io.specs[name]
                full[name] = np.zeros([batch, *shape[1:]], dtype)
            self.args = model.device_arguments(full)
            self.main = model.new_vm()["main"]
        else:
            small = {n: io.specs[n] for n in feeds}
            bounds = getattr(model, "dim_bounds", None) or getattr(model, "bounds", None)
            arrays = check_inputs(small, feeds, label, bounds)
            for name, tensor in zip(small, input_tensors(arrays, model.device)):
                self.args[self.names.index(name)] = tensor
        result = self.main(*self.args)
        at = model.output_names.index(io.logits)
        return (result[at] if len(model.output_names) > 1 else result).numpy()


def _one(specs, match, what: str) -> str:
    found = [n for n in specs if match(n.lower())]
    if not found:
        raise InputError(f"generate: the model has no {what} input (inputs: {list(specs)})")
    return found[0]
