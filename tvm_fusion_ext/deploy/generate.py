"""Generation over a compiled KV-cache decoder: a prefill, then one step per new token feeding ``present`` back as
``past``; greedy by default, sampled with transformers' processors on request (:mod:`.sampling`). Numpy only: it
runs over a loaded artifact (:func:`~tvm_fusion_ext.deploy.load`) where TVM is runtime-only, or over an
in-process :class:`~tvm_fusion_ext.runtime.CompiledModel`.

The decoder is one exported as Optimum (and ONNX Runtime GenAI) export decoders: ``input_ids``,
``attention_mask``, ``position_ids`` (optional), ``past_key_values.{i}.key/value`` ``[batch, kv_heads, past,
head_dim]`` in; ``logits`` and ``present.{i}.key/value`` out. The first call feeds a past of length 0 (the whole
prompt at once); every later call one token per row. Positions follow the mask as transformers' ``generate``
numbers them (a left-padded row's first real token is position 0), so a left-padded batch generates what each
prompt would alone. A model whose cache drops its oldest positions (a sliding window: Mistral's and Gemma2's
exports crop ``present`` to the window's last positions) gets each step a mask of the positions its past holds
and the new ones, its last columns, as the graph lines them up with the keys; a ``present`` longer than the
step's mask (a static cache), or layers keeping caches of different lengths, are refused in one line.

A model built with the in-place cache (``kv_cache="inplace"``, :mod:`.kv_cache`) is driven the same way, without
the copies: its past buffers are allocated once on the model's device, at the capacity it was compiled for,
and passed to every step with ``past_length`` (the positions filled); the step writes its keys and values into
them, so its ``present`` outputs (the same buffers) are never read back. The tokens are those of the ``concat``
build. A generation whose last step would pass the capacity (or a symbolic dim's bound) is refused before the
first step.

:func:`generate` returns the tokens; :func:`generate_stream` yields each step's new tokens as they come (what a
server sends), and both give the timings a serving team reads first (:class:`GenerationStats`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from numbers import Integral
from typing import Dict, List, Optional

import numpy as np

from ..errors import InputError
from .decoder_io import DecoderIO, InplaceCache
from .sampling import Sampling, TokenChooser, make_rng

__all__ = ["DecoderIO", "GenerationStats", "GenerationStream", "generate", "generate_stream"]


def generate(model, input_ids, max_new_tokens: int = 16, attention_mask=None, eos_token_id=None,
             pad_token_id: Optional[int] = None, *, do_sample: bool = False, temperature: float = 1.0,
             top_k: int = 50, top_p: float = 1.0, repetition_penalty: float = 1.0, seed: Optional[int] = None,
             rng: Optional[np.random.Generator] = None, streamer=None, return_stats: bool = False):
    """``[batch, prompt + new]`` token ids: the prompt followed by up to ``max_new_tokens`` tokens. ``model`` has
    ``input_specs``, ``output_names`` and ``run(feeds)`` (a :class:`~tvm_fusion_ext.deploy.DeployedModel` or a
    :class:`~tvm_fusion_ext.runtime.CompiledModel`). ``attention_mask``: 1 for prompt tokens, 0 for (left)
    padding; ones when omitted. A row that produced ``eos_token_id`` (an id or a list of ids) is finished: its
    later tokens are ``pad_token_id`` (default the first eos id), and all rows finished end the loop early, as
    transformers' ``generate`` does.

    Each token is the argmax of the step's last logits (greedy) unless ``do_sample``; the keyword-only settings
    are transformers' and act as its logits processors do, in its order: ``repetition_penalty`` (both modes; 1:
    none), then with ``do_sample`` ``temperature`` (> 0), ``top_k`` (0: off; 50 as transformers' default) and
    ``top_p`` (1: off; the most likely token always stays). A sampled token is drawn from ``rng`` (a
    ``numpy.random.Generator``) or a generator seeded with ``seed``: the same seed gives the same tokens.

    ``streamer``: a callable given each step's new tokens (``[batch]`` int64; a finished row's are padding), or
    an object with ``put`` and ``end`` as transformers' streamers have (``put`` first gets the prompt, then each
    step's tokens; so ``transformers.TextStreamer`` prints text as it comes). ``return_stats``: return
    ``(tokens, GenerationStats)``, the time to first token and per-step decode times."""
    stream = generate_stream(model, input_ids, max_new_tokens, attention_mask, eos_token_id, pad_token_id,
                             do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                             repetition_penalty=repetition_penalty, seed=seed, rng=rng)
    put, end = _streamer_calls(streamer)
    if streamer is not None and end is not None:  # transformers' protocol: the prompt first
        put(stream.tokens)
    for new in stream:
        if put is not None:
            put(new)
    if end is not None:
        end()
    return (stream.tokens, stream.stats) if return_stats else stream.tokens


def generate_stream(model, input_ids, max_new_tokens: int = 16, attention_mask=None, eos_token_id=None,
                    pad_token_id: Optional[int] = None, *, do_sample: bool = False, temperature: float = 1.0,
                    top_k: int = 50, top_p: float = 1.0, repetition_penalty: float = 1.0,
                    seed: Optional[int] = None, rng: Optional[np.random.Generator] = None) -> "GenerationStream":
    """:func:`generate` as an iterator: ``for new in generate_stream(...)`` gives each step's new tokens
    (``[batch]`` int64) as soon as the step has run; the stream's ``tokens`` are all tokens so far and its
    ``stats`` the timings. Arguments are checked (and a generation past the model's bounds refused) when it is
    called, before any step runs."""
    sampling = Sampling(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                        repetition_penalty=repetition_penalty)
    return GenerationStream(model, input_ids, max_new_tokens, attention_mask, eos_token_id, pad_token_id,
                            TokenChooser(sampling, make_rng(seed, rng)))


@dataclass
class GenerationStats:
    """What a generation took, as a serving team measures it: the model's time, not the consumer's between
    steps. A step's time runs from its inputs to its chosen tokens (the model call included)."""

    #: rows in the batch
    batch: int
    #: prompt tokens over the batch, padding not counted
    prompt_tokens: int
    #: tokens generated over the batch (each row's eos included; a finished row's padding not)
    new_tokens: int = 0
    #: the prefill: the first call (the whole prompt) and its tokens; 0.0 when no token was asked for
    time_to_first_token_s: float = 0.0
    #: each later step (one token per row), in order
    step_times_s: List[float] = field(default_factory=list)
    #: tokens those later steps generated (as ``new_tokens`` counts them)
    decode_tokens: int = 0

    @property
    def decode_s(self) -> float:
        """The later steps together."""
        return float(sum(self.step_times_s))

    @property
    def step_s(self) -> float:
        """The median step after the prefill (0.0 without one): the per-token latency of a row."""
        return float(statistics.median(self.step_times_s)) if self.step_times_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput over the batch: the later steps' tokens per second of those steps (0.0 without)."""
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def to_dict(self) -> Dict[str, float]:
        """The fields and the derived figures, for JSON."""
        return {"batch": self.batch, "prompt_tokens": self.prompt_tokens, "new_tokens": self.new_tokens,
                "time_to_first_token_s": self.time_to_first_token_s, "decode_steps": len(self.step_times_s),
                "decode_s": self.decode_s, "step_s": self.step_s, "tokens_per_s": self.tokens_per_s}

    def summary(self) -> str:
        """One line: time to first token, median decode step, throughput."""
        return (f"time to first token {self.time_to_first_token_s * 1e3:.2f} ms (batch {self.batch}, "
                f"{self.prompt_tokens} prompt tokens); {len(self.step_times_s)} decode steps, median "
                f"{self.step_s * 1e3:.2f} ms/step, {self.tokens_per_s:.1f} tokens/s; {self.new_tokens} new tokens")


class GenerationStream:
    """The steps of one generation, run one per ``next()``: each gives that step's new tokens ``[batch]``.
    ``tokens`` holds the prompt and every token so far, ``stats`` the timings (:class:`GenerationStats`)."""

    def __init__(self, model, input_ids, max_new_tokens, attention_mask, eos_token_id, pad_token_id,
                 choose: TokenChooser):
        ids = np.asarray(input_ids)
        if ids.ndim != 2 or ids.shape[1] == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise InputError(f"generate: input_ids must be a [batch, length >= 1] integer array, got shape "
                             f"{ids.shape} {ids.dtype}")
        if not isinstance(max_new_tokens, Integral) or max_new_tokens < 0:
            raise InputError(f"generate: max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        mask = np.ones(ids.shape, np.int64) if attention_mask is None else np.asarray(attention_mask)
        if mask.shape != ids.shape:
            raise InputError(f"generate: attention_mask has shape {mask.shape}, input_ids {ids.shape}")
        self.eos = _eos_ids(eos_token_id)
        self.pad = pad_token_id if pad_token_id is not None or self.eos is None else int(self.eos[0])
        self.model, self.io, self.choose = model, DecoderIO(model), choose
        self.label = label = getattr(model, "path", None) or getattr(model, "label", "model")
        self.io.check_room(model, ids.shape[1], int(max_new_tokens), label)
        self.max_new_tokens = int(max_new_tokens)
        self.tokens: np.ndarray = ids.astype(np.int64)
        self.mask = mask.astype(np.int64)
        self.stats = GenerationStats(batch=ids.shape[0], prompt_tokens=int((self.mask != 0).sum()))
        self._steps = self._run()

    def __iter__(self) -> "GenerationStream":
        return self

    def __next__(self) -> np.ndarray:
        return next(self._steps)

    def _run(self):
        io, model, batch = self.io, self.model, self.tokens.shape[0]
        past = io.empty_past(batch)
        inplace = InplaceCache(model, io) if io.length is not None else None
        step_ids, step_mask = self.tokens, self.mask
        positions = np.maximum(np.cumsum(step_mask, axis=1) - 1, 0)
        finished = np.zeros(batch, bool)
        for step in range(self.max_new_tokens):
            start = time.perf_counter()
            if inplace is not None:
                logits = inplace.step(io.feeds(step_ids, step_mask, positions, {}),
                                      step_mask.shape[1] - step_ids.shape[1])
            else:
                out = model.run(io.feeds(step_ids, step_mask, positions, past))
                logits = out[io.logits]
            nxt = self.choose(logits[:, -1, :], self.tokens)
            live = int((~finished).sum())
            if self.eos is not None:
                nxt = np.where(finished, self.pad, nxt).astype(np.int64)
                finished |= np.isin(nxt, self.eos)
            self.tokens = np.concatenate([self.tokens, nxt[:, None]], axis=1)
            self._record(step, time.perf_counter() - start, live)
            yield nxt
            if self.eos is not None and finished.all():
                return
            if inplace is None:
                past = {name: out[present] for name, present in io.present_of.items()}
                step_mask = io.cached_mask(step_mask, past, self.label)
            step_mask = np.concatenate([step_mask, np.ones((batch, 1), np.int64)], axis=1)
            positions = positions[:, -1:] + 1
            step_ids = nxt[:, None]

    def _record(self, step: int, seconds: float, tokens: int) -> None:
        stats = self.stats
        stats.new_tokens += tokens
        if step == 0:
            stats.time_to_first_token_s = seconds
        else:
            stats.step_times_s.append(seconds)
            stats.decode_tokens += tokens


def _eos_ids(eos_token_id) -> Optional[np.ndarray]:
    """The stop ids as an int64 array (None for none): one id or a list of them, as transformers takes."""
    if eos_token_id is None:
        return None
    ids = np.atleast_1d(np.asarray(eos_token_id))
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise InputError(f"generate: eos_token_id must be a token id or a non-empty list of them, got "
                         f"{eos_token_id!r}")
    return ids.astype(np.int64)


def _streamer_calls(streamer):
    """``(put, end)``: a callable streamer is its own ``put``; transformers' streamers have both."""
    if streamer is None:
        return None, None
    if hasattr(streamer, "put") and hasattr(streamer, "end"):
        return streamer.put, streamer.end
    if callable(streamer):
        return streamer, None
    raise InputError(f"generate: streamer must be a callable or have put() and end() (transformers' streamers), "
                     f"got {type(streamer).__name__}")
