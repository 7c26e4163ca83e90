"""A KV-cache decoder's steps as generation feeds them: which input and output is which (read from their names
once), the feeds of one step, the longest generation the model's bounds admit, and, for a model built with the
in-place cache (``kv_cache="inplace"``, :mod:`.kv_cache`), its past buffers kept on the device across steps.
Numpy only (runtime-only TVM)."""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..errors import InputError


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

    def position_limit(self, model) -> Optional[Tuple[int, str]]:
        """The most positions (cached + new) one step's mask may cover, and what sets it: the in-place cache's
        capacity, or the upper bounds of the mask's and the past's symbolic dims; None when nothing bounds it."""
        limits = []
        kv = getattr(model, "kv_cache", None) or {}
        if self.length is not None and kv.get("capacity") is not None:
            limits.append((int(kv["capacity"]), f"the KV cache's capacity of {int(kv['capacity'])}"))
        bounds = getattr(model, "dim_bounds", None) or getattr(model, "bounds", None) or {}
        mask_dims = tuple(self.specs[self.mask][0])
        past_dims = tuple(self.specs[self.past[0]][0])
        for dim, extra, what in ((mask_dims[-1] if mask_dims else None, 0, self.mask),
                                 (past_dims[2] if self.length is None and len(past_dims) > 2 else None, 1,
                                  self.past[0])):
            upper = bounds.get(dim, (None, None))[1] if isinstance(dim, str) else None
            if upper is not None:
                limits.append((int(upper) + extra, f"the bound {upper} of {what}'s dim '{dim}'"))
        return min(limits) if limits else None

    def check_room(self, model, prompt: int, new_tokens: int, label: str) -> None:
        """Refuse, before any step runs, a generation whose last step would not fit the model: a prompt of
        ``prompt`` positions and ``new_tokens`` tokens cover ``prompt + new_tokens - 1`` positions at the last
        call (the last token is chosen, never fed)."""
        limit = self.position_limit(model) if new_tokens > 0 else None
        need = prompt + new_tokens - 1
        if limit is None or need <= limit[0]:
            return
        fit = limit[0] - prompt + 1
        advice = (f"at most {fit} new tokens fit" if fit > 0 else "the prompt alone does not fit")
        positions = f"{prompt} position{'s' * (prompt != 1)}"
        raise InputError(f"generate: {label}: a prompt of {positions} and max_new_tokens={new_tokens} reach "
                         f"{need} positions at the last step, past {limit[1]}; {advice}, or compile with a larger "
                         f"--max-shape")

    def past_axis(self, name: str) -> int:
        """The axis of a past input that counts cached positions: its first symbolic dim after the batch."""
        dims = list(self.specs[name][0])
        return next((i for i, d in enumerate(dims[1:], 1) if not isinstance(d, int)), min(2, len(dims) - 1))

    def cached_mask(self, mask: np.ndarray, past: Mapping[str, np.ndarray], label: str) -> np.ndarray:
        """The columns of ``mask`` (the step just run: cached + new positions) that the next past holds. A model
        whose cache keeps every position returns all of them; one that drops its oldest positions (a sliding
        window: Mistral, Gemma2) returns fewer keys than the mask covered, and the next step's mask must cover
        only those, its last columns, or the graph lines its padding up with the wrong keys. A cache longer than
        the mask (a static cache, padded to a fixed length) or layers keeping different lengths cannot be
        driven by one mask: refused in one line."""
        lengths = {name: int(np.shape(value)[self.past_axis(name)]) for name, value in past.items()}
        kept = set(lengths.values())
        if len(kept) > 1:
            short = min(lengths, key=lengths.get)
            long = max(lengths, key=lengths.get)
            raise InputError(f"generate: {label}: its layers keep caches of different lengths "
                             f"({self.present_of[short]} {lengths[short]} positions, {self.present_of[long]} "
                             f"{lengths[long]}: sliding-window layers beside full ones), which one attention_mask "
                             f"cannot cover: a prompt and max_new_tokens reaching at most {lengths[short]} positions "
                             f"fit, or export with a sliding window of at least the longest generation")
        if not kept:
            return mask
        length = kept.pop()
        if length > mask.shape[1]:
            name = next(iter(lengths))
            raise InputError(f"generate: {label}: {self.present_of[name]} holds {length} positions after a step whose "
                             f"attention_mask covered {mask.shape[1]}: the model's cache is not the past followed by "
                             f"the new tokens (a static cache?), which generate cannot feed back")
        return mask[:, mask.shape[1] - length:]

    def feeds(self, ids, mask, positions, past) -> Dict[str, np.ndarray]:
        feeds = {self.ids: ids.astype(self.specs[self.ids][1]), self.mask: mask.astype(self.specs[self.mask][1])}
        if self.positions is not None:
            feeds[self.positions] = positions.astype(self.specs[self.positions][1])
        feeds.update(past)
        return feeds


class InplaceCache:
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
