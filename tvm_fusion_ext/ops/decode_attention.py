"""The decode form of ``fused_attention``: one query row per (sequence, head) against T cached keys, split-K.

A decode step (every token of a generation loop after the first) has a single query row. The flash loop of
the prefill form (:mod:`.attention`) then parallelises over batch × heads only, scans every key serially per
row, and for grouped K/V heads (GQA / MQA) reads each K/V head once per query head. This form instead, as
flash-decoding does:

* cuts the keys into *splits* of ``split_blocks`` key blocks (``key_block`` keys each); per
  (batch, K/V head, split) it folds its blocks into a partial max, sum and unnormalised output with the
  online softmax of the prefill form (``dec_split``; a split of one block takes its block's state as it is);
* computes those partials for all ``group = H / Hkv`` query heads of a K/V head together: each K/V row is
  loaded once and used by every query head that shares it;
* combines the splits with the same online-softmax fold (``dec_merge``), then divides (``dec_out``).

The number of splits is ``ceil(ceil(T / key_block) / split_blocks)``: it follows the key count, so a symbolic
T (a growing cache) needs no re-build, a short cache is one split (bounded work: T = 1 is one key block), and a
long one gives every core several tasks even at batch 1. Keys past T (the last block's and last split's
padding) read the last key and weigh exactly 0.

Semantics are those of ``fused_attention`` for its row 0 (so a 1-row query gives identical results, up to
rounding order): the additive mask broadcast against (B, H, S, T) read at row 0 (padded and left-padded pasts
arrive as mask values), ``causal`` keeps keys ``j <= T - S``, soft-capping, head ranges, rotary Q/K, V's own
head dim. The caller (``fused_attention`` with its ``split_blocks`` parameter) has checked the shapes; the
query rows must be 1 when the kernel runs (a symbolic S is taken only under a run-time ``S == 1`` branch,
:mod:`...compile.variants.decode`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from tvm import te, tirx

from .online_softmax import fast_exp, online_softmax_reducer, single_triple_reducer

ACC = "float32"
#: keys per block when the key count is known only at run time: long enough that each block's fixed work (its
#: row max and sum, per query head) spreads over many keys; a one-token cache computes the rest of its block as
#: masked padding (a few microseconds)
DECODE_KEY_BLOCK = 256
#: key blocks per split by default: one, 256 keys per task (512 keys, a past of 511 and the new one, make 2 splits
#: per K/V head, eight tasks for a batch-1 step of 4 K/V heads). A split of one block has no fold (whose
#: rescaling takes an exponential per query head and head dim); longer splits waste up to split_blocks - 1 blocks
#: of padding in the last split and leave fewer tasks for the cores at batch 1, shorter ones add partials to
#: combine. LLaMA-1024's 16 heads on 4 K/V heads, d 64, the kernel alone, calls interleaved, 2-core Zen 3 VM, ms
#: at (batch, past) = (1, 511) / (4, 511) / (1, 2047) / (4, 2047): 128-key blocks, 2 per split 0.104 / 0.349 /
#: 0.349 / 1.49-2.2; 1 per split 0.098 / 0.335 / 0.319 / 2.17-2.22; 256-key blocks, 1 per split 0.093 / 0.312 /
#: 0.306 / 1.36-2.08 (a busy hour: batch 4, past 2047 moved between runs; 1.36 against 1.49 in the quietest). Short
#: pasts too: 0.056 -> 0.052 ms at (1, 0), 0.137 -> 0.122 at (4, 100), 128-key blocks 2 per split -> 256 keys 1
DEFAULT_SPLIT_BLOCKS = 1


def decode_key_block(keys) -> int:
    """The decode form's key block for ``keys`` keys (an ``int``, or symbolic): a power of two covering a short
    cache, at most :data:`DECODE_KEY_BLOCK`."""
    if not isinstance(keys, int):
        return DECODE_KEY_BLOCK
    kb = 8
    while kb < min(keys, DECODE_KEY_BLOCK):
        kb *= 2
    return kb


def decode_params(params: dict, keys, key_block: Optional[int] = None, split_blocks: Optional[int] = None) -> dict:
    """``fused_attention``'s parameters for its decode form over ``keys`` keys: the key block and split size set
    (a target's template may ask for its own), any query tile dropped (one row)."""
    out = {k: v for k, v in params.items() if k != "query_block"}
    return dict(out, key_block=key_block or decode_key_block(keys), split_blocks=split_blocks or DEFAULT_SPLIT_BLOCKS)


@dataclass(frozen=True)
class DecodeOperands:
    """What the decode form reads, as index functions prepared by ``fused_attention`` (head ranges, rotary
    tables and layouts already applied): ``q(b, h, d)`` at query row 0, ``k(b, hk, j, d)``, ``v(b, hk, j, d)``,
    ``mask(b, h, j)`` (None without a mask) — each in any dtype; fp32 is taken. ``mask_per_head``: whether the
    mask differs between heads (else it is read once per key for all heads)."""

    q: Callable
    k: Callable
    v: Callable
    mask: Optional[Callable]
    mask_per_head: bool = True


def decode_attention(ops: DecodeOperands, *, B, S, T, H, HKV, D, DV, scale: float, softcap: float, causal: bool,
                     out_layout: str, out_dtype: str, key_block, split_blocks: int, symbolic: bool,
                     last_key=None) -> te.Tensor:
    """The decode kernel's stages; returns the output (``B, S, H, DV`` in BSHD or ``B, H, S, DV`` in BHSD).
    ``last_key``: the last key index a read may take (default ``T - 1``; a preallocated cache's is also within
    its capacity)."""
    group = int(H) // int(HKV)
    index = "int64" if symbolic else "int32"
    c = lambda v: tirx.IntImm(index, v)  # noqa: E731
    f32 = lambda x: tirx.const(x, ACC)  # noqa: E731
    kb, sb = c(int(key_block)), c(int(split_blocks))
    nb = (T + kb - c(1)) // kb
    splits = (nb + sb - c(1)) // sb
    lowest, neg_inf = tirx.min_value(ACC), f32(float("-inf"))
    G = c(group)

    def key(sp, jb, jj):
        return sp * (sb * kb) + jb * kb + jj

    def clamped(sp, jb, jj):
        return tirx.min(key(sp, jb, jj), T - c(1) if last_key is None else last_key)

    # K copied key-contiguous per block, for a q·kᵀ micro-kernel whose vector runs over keys (a template keeps the
    # copy of one block under its split, an L1 tile, so K is read from memory once); the CPU template inlines it
    # when the head dim is whole vectors and takes dot products along the head dim instead
    kt = te.compute((B, HKV, splits, sb, D, kb),
                    lambda b, hk, sp, jb, d, jj: ops.k(b, hk, clamped(sp, jb, jj), d).astype(ACC),
                    name="dec_kt", attrs={"schedule_rule": "None"})
    # the group's query rows in fp32 (rotated, for rotary Q), once per task rather than once per key
    qg = te.compute((B, HKV, G, D), lambda b, hk, g, d: ops.q(b, hk * G + g, d).astype(ACC), name="dec_q",
                    attrs={"schedule_rule": "None"})
    rd = te.reduce_axis((0, D), name="rd")
    qk = te.compute((B, HKV, splits, sb, G, kb), lambda b, hk, sp, jb, g, jj: te.sum(
        qg[b, hk, g, rd] * kt[b, hk, sp, jb, rd, jj], axis=rd),
        name="dec_qk", attrs={"schedule_rule": "None"})

    def visible(sp, jb, jj):
        j = key(sp, jb, jj)
        if causal:  # row 0 of S sees keys j <= T - S (all of them when S = 1)
            return tirx.all(j < T, j <= T - S)
        return j < T

    # what every head of a key adds to its score, once per key: the mask (when the heads share it) where the key
    # is visible, -inf where not. A mask read past the cache's end is clamped, which makes the read a gather
    shared = ops.mask is None or not ops.mask_per_head
    if shared:
        bias = te.compute((B, splits, sb, kb), lambda b, sp, jb, jj: tirx.Select(
            visible(sp, jb, jj), f32(0.0) if ops.mask is None else ops.mask(b, c(0), clamped(sp, jb, jj)).astype(ACC),
            neg_inf), name="dec_bias", attrs={"schedule_rule": "None"})

    def score(b, hk, sp, jb, g, jj):
        s = qk[b, hk, sp, jb, g, jj] * f32(scale)
        if softcap:
            s = f32(softcap) * tirx.tanh(s * f32(1.0 / softcap))
        if shared:
            return s + bias[b, sp, jb, jj]
        s = s + ops.mask(b, hk * G + g, clamped(sp, jb, jj)).astype(ACC)
        return tirx.Select(visible(sp, jb, jj), s, neg_inf)

    # the scores once per block: the row max and the exps both read them (a template inlines them where its
    # threads would compute each score once anyway)
    scores = te.compute((B, HKV, splits, sb, G, kb), score, name="dec_s", attrs={"schedule_rule": "None"})
    jj1 = te.reduce_axis((0, kb), name="jj1")
    bmax = te.compute((B, HKV, splits, sb, G), lambda b, hk, sp, jb, g: te.max(scores[b, hk, sp, jb, g, jj1], axis=jj1),
                      name="dec_bmax", attrs={"schedule_rule": "None"})

    def prob(b, hk, sp, jb, g, jj):
        s = scores[b, hk, sp, jb, g, jj]
        return tirx.Select(s >= lowest, fast_exp(s - bmax[b, hk, sp, jb, g], bind=False), f32(0.0))

    p = te.compute((B, HKV, splits, sb, G, kb), prob, name="dec_p", attrs={"schedule_rule": "None"})
    jj2 = te.reduce_axis((0, kb), name="jj2")
    bsum = te.compute((B, HKV, splits, sb, G), lambda b, hk, sp, jb, g: te.sum(p[b, hk, sp, jb, g, jj2], axis=jj2),
                      name="dec_bsum", attrs={"schedule_rule": "None"})
    # V's block as a tile of its own: a GPU template stages it once for the group (in shared memory); a CPU one
    # inlines it and streams V rows from memory
    vt = te.compute((B, HKV, splits, sb, kb, DV),
                    lambda b, hk, sp, jb, jj, d: ops.v(b, hk, clamped(sp, jb, jj), d).astype(ACC),
                    name="dec_vt", attrs={"schedule_rule": "None"})
    jj3 = te.reduce_axis((0, kb), name="jj3")
    bo = te.compute((B, HKV, splits, sb, G, DV), lambda b, hk, sp, jb, g, d: te.sum(
        p[b, hk, sp, jb, g, jj3] * vt[b, hk, sp, jb, jj3, d], axis=jj3),
        name="dec_bo", attrs={"schedule_rule": "None"})

    online = online_softmax_reducer()
    # a split of one key block takes its block's max, sum and output as they are: the fold's rescaling would take
    # an exponential per query head and head dim (the reduction over one block stays, for the templates' loops)
    fold = online if int(split_blocks) > 1 else single_triple_reducer()
    rb = te.reduce_axis((0, sb), name="rb")
    s_max, s_sum, s_out = te.compute(
        (B, HKV, splits, G, DV),
        lambda b, hk, sp, g, d: fold((bmax[b, hk, sp, rb, g], bsum[b, hk, sp, rb, g], bo[b, hk, sp, rb, g, d]),
                                     axis=rb),
        name="dec_split", attrs={"schedule_rule": "None"})
    rs = te.reduce_axis((0, splits), name="rs")
    _, m_sum, m_out = te.compute(
        (B, HKV, G, DV),
        lambda b, hk, g, d: online((s_max[b, hk, rs, g, d], s_sum[b, hk, rs, g, d], s_out[b, hk, rs, g, d]),
                                   axis=rs),
        name="dec_merge", attrs={"schedule_rule": "None"})

    def finish(b, h, d):
        hk, g = (h // G, h % G) if group > 1 else (h, c(0))
        l_ = m_sum[b, hk, g, d]
        # l == 0 only when no key is visible: 0 instead of 0/0, as the prefill form
        return tirx.Select(l_ > f32(0.0), m_out[b, hk, g, d] / l_, f32(0.0)).astype(out_dtype)

    rule = {"schedule_rule": "tfx.decode_attention"}
    if out_layout == "BHSD":
        return te.compute((B, H, S, DV), lambda b, h, i, d: finish(b, h, d), name="dec_out", attrs=rule)
    return te.compute((B, S, H, DV), lambda b, i, h, d: finish(b, h, d), name="dec_out", attrs=rule)
