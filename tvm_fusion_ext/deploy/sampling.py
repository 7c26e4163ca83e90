"""Choosing each generated token from a step's logits, with the semantics of transformers' ``generate``: its
logits processors and warpers in its order (repetition penalty, then with sampling temperature, top-k, top-p),
then the argmax (greedy) or a draw from the softmax. Numpy only: it runs where TVM is runtime-only and torch is
absent.

A draw takes one uniform number ``u`` in [0, 1) per row and step from a ``numpy.random.Generator`` and picks the
first token whose cumulative probability passes ``u`` (inverse CDF), so the tokens are a function of the logits
and of those numbers alone: a reference given the same numbers picks the same tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Optional

import numpy as np

from ..errors import InputError


@dataclass(frozen=True)
class Sampling:
    """How a step's token is chosen. Defaults are transformers' (``top_k`` 50 applies only with sampling, as
    there); ``temperature``, ``top_k`` and ``top_p`` act only with ``do_sample``, ``repetition_penalty`` in both
    modes. Values transformers' processors refuse are refused here, in one line."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def __post_init__(self):
        if not _number(self.temperature) or not self.temperature > 0:
            raise InputError(f"generate: temperature must be a number > 0, got {self.temperature!r} "
                             f"(greedy decoding is the default: do not sample)")
        if not isinstance(self.top_k, Integral) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise InputError(f"generate: top_k must be an integer >= 0 (0: no top-k filter), got {self.top_k!r}")
        if not _number(self.top_p) or not 0 <= self.top_p <= 1:
            raise InputError(f"generate: top_p must be a number in [0, 1] (1: no top-p filter), got {self.top_p!r}")
        if not _number(self.repetition_penalty) or not self.repetition_penalty > 0:
            raise InputError(f"generate: repetition_penalty must be a number > 0 (1: none), got "
                             f"{self.repetition_penalty!r}")

    def process(self, scores: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """``scores`` ``[batch, vocab]`` as the chosen token is taken from them: each processor transformers'
        ``generate`` would add for these settings, in its order (a filtered token's score is ``-inf``).
        ``tokens`` ``[batch, length]``: every token so far, prompt and padding included (what transformers
        penalises)."""
        scores = np.asarray(scores, np.float32)
        if self.repetition_penalty != 1.0:
            scores = repetition_penalty(scores, tokens, self.repetition_penalty)
        if not self.do_sample:
            return scores
        if self.temperature != 1.0:
            scores = scores / np.float32(self.temperature)
        if self.top_k != 0:
            scores = top_k(scores, self.top_k)
        if self.top_p < 1.0:
            scores = top_p(scores, self.top_p)
        return scores


def repetition_penalty(scores: np.ndarray, tokens: np.ndarray, penalty: float) -> np.ndarray:
    """transformers' ``RepetitionPenaltyLogitsProcessor``: the score of each token that occurs in the row's
    ``tokens`` is divided by ``penalty`` where positive, multiplied where negative (its gather and scatter)."""
    batch, vocab = scores.shape
    # ids past the logits' vocabulary (an embedding larger than the head) land in a column dropped after
    padded = np.concatenate([scores, np.zeros((batch, 1), np.float32)], axis=-1)
    ids = np.minimum(np.asarray(tokens, np.int64), vocab)
    seen = np.take_along_axis(padded, ids, axis=-1)
    np.put_along_axis(padded, ids, np.where(seen < 0, seen * np.float32(penalty), seen / np.float32(penalty)),
                      axis=-1)
    return padded[:, :vocab]


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """transformers' ``TopKLogitsWarper``: scores below the row's k-th largest become ``-inf`` (ties with it
    stay)."""
    k = min(max(int(k), 1), scores.shape[-1])
    kth = np.partition(scores, -k, axis=-1)[:, -k, None]
    return np.where(scores < kth, np.float32(-np.inf), scores)


def top_p(scores: np.ndarray, p: float) -> np.ndarray:
    """transformers' ``TopPLogitsWarper`` (nucleus): the least likely tokens whose probabilities sum to at most
    ``1 - p`` become ``-inf``; the most likely token always stays."""
    order = np.argsort(scores, axis=-1, kind="stable")  # ascending, as the warper sorts
    cumulative = np.cumsum(softmax(np.take_along_axis(scores, order, axis=-1)), axis=-1)
    drop_sorted = cumulative <= np.float32(1 - p)
    drop_sorted[:, -1] = False
    drop = np.empty_like(drop_sorted)
    np.put_along_axis(drop, order, drop_sorted, axis=-1)
    return np.where(drop, np.float32(-np.inf), scores)


def softmax(scores: np.ndarray) -> np.ndarray:
    """Row-wise softmax in the scores' precision (``-inf`` scores get probability 0)."""
    shifted = scores - scores.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


def draw(probs: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Per row, the first token whose cumulative probability exceeds ``u`` times the row's total (inverse CDF
    on ``uniforms`` in [0, 1)); a token of probability 0 is never drawn."""
    probs = np.asarray(probs, np.float64)
    cdf = np.cumsum(probs, axis=-1)
    threshold = np.asarray(uniforms, np.float64)[:, None] * cdf[:, -1:]
    picked = (cdf <= threshold).sum(axis=-1)
    last_possible = probs.shape[-1] - 1 - np.argmax(probs[:, ::-1] > 0, axis=-1)  # u * total rounding up to total
    return np.minimum(picked, last_possible).astype(np.int64)


class TokenChooser:
    """A generation's next tokens from each step's last logits, drawing from ``rng`` when sampling.

    It takes the tokens :func:`draw` would take from the softmax of :meth:`Sampling.process`'s scores, without
    sorting or exponentiating the whole vocabulary per row: after top-k only the k kept tokens (and ties) are
    candidates; with top-p alone, the fewest most likely tokens whose probability leaves less than ``1 - top_p``
    outside (every token outside is one the filter drops)."""

    def __init__(self, sampling: Sampling, rng: Optional[np.random.Generator] = None):
        self.sampling = sampling
        self.rng = rng if rng is not None or not sampling.do_sample else np.random.default_rng()

    def __call__(self, logits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """``[batch]`` int64: the next token of each row, from ``logits`` ``[batch, vocab]``."""
        s = self.sampling
        if not s.do_sample and s.repetition_penalty == 1.0:
            return logits.argmax(axis=-1).astype(np.int64)  # plain greedy: the raw logits' argmax
        scores = np.asarray(logits, np.float32)
        if s.repetition_penalty != 1.0:
            scores = repetition_penalty(scores, tokens, s.repetition_penalty)
        if not s.do_sample:
            return scores.argmax(axis=-1).astype(np.int64)
        if s.temperature != 1.0:
            scores = scores / np.float32(s.temperature)
        uniforms = self.rng.random(scores.shape[0])  # one per row and step, finished rows included
        return np.array([_sample_row(row, s.top_k, s.top_p, u) for row, u in zip(scores, uniforms)], np.int64)


def _sample_row(scores: np.ndarray, k: int, p: float, u: float) -> int:
    """One row's token: top-k, then top-p over the candidates, then the inverse-CDF draw in vocabulary order."""
    vocab = scores.size
    top = scores.max()
    outside = 0.0  # probability of the tokens left out of the candidates (before top-p)
    if k:
        kth = np.partition(scores, vocab - min(k, vocab))[vocab - min(k, vocab)]
        candidates = np.flatnonzero(scores >= kth)  # in vocabulary order; ties with the k-th stay
        weights = np.exp(scores[candidates] - top)
        total = weights.sum(dtype=np.float32)
    else:
        every = np.exp(scores - top)
        total = every.sum(dtype=np.float32)
        candidates, outside = _nucleus(scores, every, total, p) if p < 1.0 else (np.arange(vocab), 0.0)
        weights = every[candidates]
    if p < 1.0:  # the warper's test, over the candidates sorted ascending, with the mass outside below them
        order = np.argsort(scores[candidates], kind="stable")
        cumulative = np.float32(outside) + np.cumsum(weights[order] / total, dtype=np.float32)
        drop = cumulative <= np.float32(1 - p)
        drop[-1] = False
        weights = weights.copy()
        weights[order[drop]] = 0.0
    return int(candidates[draw(weights[None], np.array([u]))[0]])


def _nucleus(scores: np.ndarray, every: np.ndarray, total: float, p: float):
    """``(candidates in vocabulary order, probability outside them)``: the m most likely tokens, m growing
    fourfold from 64, once what lies outside is below ``1 - p`` by a margin past float32 rounding."""
    vocab, m = scores.size, 64
    while m < vocab:
        inside = np.argpartition(scores, vocab - m)[vocab - m:]
        outside = 1.0 - float(every[inside].sum(dtype=np.float64)) / float(total)
        if outside < (1.0 - p) - 1e-5:
            return np.sort(inside), outside
        m *= 4
    return np.arange(vocab), 0.0


def make_rng(seed, rng) -> Optional[np.random.Generator]:
    """``rng``, or a generator seeded with ``seed``; one line when both or neither is usable."""
    if seed is not None and rng is not None:
        raise InputError("generate: give seed or rng, not both")
    if rng is not None:
        if not isinstance(rng, np.random.Generator):
            raise InputError(f"generate: rng must be a numpy.random.Generator, got {type(rng).__name__}")
        return rng
    if seed is None:
        return None
    if not isinstance(seed, Integral) or isinstance(seed, bool) or seed < 0:
        raise InputError(f"generate: seed must be an integer >= 0, got {seed!r}")
    return np.random.default_rng(int(seed))


def _number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
