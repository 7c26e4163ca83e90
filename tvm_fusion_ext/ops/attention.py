"""fused_attention: ``softmax(cap(scale · q kᵀ) + mask [causal]) v`` in one kernel, flash style.

V's head dim may differ from Q's and K's (DeepSeek's multi-head latent attention: 192 against 128; LeViT):
the output has V's.

Keys are processed in blocks of ``key_block``. Per (query row, key block) the kernel forms the scores, the
block max ``bmax``, ``p = exp(score - bmax)``, the block sum ``bsum`` and the partial product ``bo = p v``; an
online-softmax reduction over key blocks (running max, running sum, running numerator) then folds the blocks
in one pass. The exponentials of the scores are computed once per (row, key) and shared across the head
dimension; only the per-block rescale runs per output column, i.e. ``T / key_block`` times per row.

All S×T-shaped stages are indexed (…, key block, key in block), so the schedule can place them under the
key-block loop of a query tile: what remains in memory is a query tile × key block score tile and the
running statistics, O(S·d) in total. The one buffer not placed that way is ``attn_kt``, K transposed to
(B, H, T/key_block, D, key_block) so that the q·kᵀ micro-kernel reads keys contiguously (O(T·d)).

Semantics the graph-side rules rely on:

* ``softcap`` (Gemma 2's logit soft-capping): when non-zero, the scaled scores ``s`` become
  ``softcap · tanh(s / softcap)`` before any mask is added (``cap`` above; the identity when 0).
* ``mask`` (rank ≤ 4) is broadcast right-aligned against (B, H, S, T) and added to the scaled scores.
* ``causal``: key ``j`` is visible to query ``i`` iff ``j <= i + T - S``. Key blocks no row of a query tile
  can see are skipped by the compiled kernel (:mod:`..compile.variants.causal_skip`): about half the work.
* Grouped-query attention: K and V may have fewer heads ``Hkv`` than Q (``H % Hkv == 0``); query head ``h``
  reads K/V head ``h // (H / Hkv)`` in place (``repeat_kv``'s order), so no repeated K/V exists.
* Head ranges (``heads``, ``kv_heads``, ``q_head_start``, ``k_head_start``, ``v_head_start``): an operand may
  hold more heads than it contributes; Q is heads ``[q_head_start, q_head_start + heads)`` of ``q``'s head axis,
  K and V ``kv_heads`` heads from their starts. A fused QKV projection's output, viewed as
  ``[B, S, H + 2·Hkv, D]``, is then passed as all three operands, and no split copies it apart
  (:mod:`..transform.attention_qkv_heads`). Defaults: every head of each operand (the original form).
* Rotary embeddings (``q_rope`` / ``k_rope`` = ``"half"`` or ``"interleaved"``): the operand is read as
  ``x·cos + rot(x)·sin`` with ``cos``/``sin`` of shape (1 | B, 1 | L, D) (L = S for q, T for k). ``rot`` is
  rotate-half (``[-x₂, x₁]`` of the two halves of the head dim) or the interleaved form (``(-x₁, x₀)`` per
  pair). Q is rotated into a per-query-tile stage ``attn_qr`` (the template places it under the tile loop),
  K while it is copied into key blocks (``attn_kt``): no rotated copy of Q or K is ever written whole.
* Preallocated K/V (``preallocated_kv``): K and V are caches of a capacity of their own (their key axis may be
  longer than the keys in use); the key count ``T`` is the mask's last dim and only keys ``[0, T)`` are read.
  The in-place KV-cache build (:mod:`..compile.kv_cache`) passes the whole cache this way, so no copy of its
  valid prefix is ever made. Needs a mask whose last dim is the key count, and K without rotary tables.
* Keys whose score is -inf (mask -inf, causal, padding) get weight exactly 0. A row with no visible key
  yields 0 (no NaN): this is what SDPA exports guard with ``Where(IsNaN, 0, ·)``. Finite big-negative masks
  (-3.4e38, -10000) are ordinary scores; the running max starts at the lowest *finite* value so no
  ``inf - inf`` is ever formed.

Decode form: given ``split_blocks``, one query row (a decode step: S = 1, or a symbolic S the caller runs only at
1) is computed split-K instead (:mod:`.decode_attention`): per (batch, K/V head, split of ``split_blocks`` key
blocks) partial softmax statistics for all query heads of the group, then one combine. Same semantics for the
row; the padded/packed query forms do not apply.

Variable-length (packed) form: given ``cu_seqlens``, ``row_seq`` and ``key_bias``, Q/K/V hold the tokens of
``N`` sequences packed back to back as one batch of ``T`` rows (``[1, T, H, D]``, BSHD); sequence ``n`` owns rows
``[cu_seqlens[n], cu_seqlens[n+1])`` and each query row attends to the keys of its own sequence only.
``row_seq [T]`` is the sequence of each packed row (given rather than found by a binary search over
``cu_seqlens`` in every kernel: the graph gets it for free from the packing indices, and a per-row lookup keeps
the kernel's index expressions as simple as the padded ones). ``key_bias [N, L]`` is added to the score of the
``k``-th key of sequence ``n`` (``L`` bounds every sequence length: it is the padded length the keys came from),
the varlen counterpart of a key-only additive mask. ``causal`` compares positions within the sequence.
The kernel has the stages of the padded form with a batch of one (so the same templates schedule it): K (and V)
are cut into key blocks per sequence (``attn_kt[n, ...]``), query rows read the blocks of ``row_seq[i]``. As
defined, a row visits ``L / key_block`` blocks whatever its sequence's length; the build bounds each query tile's
loop by the blocks its sequences span (:mod:`..compile.variants.causal_skip`).
"""

from __future__ import annotations

from typing import Optional

from tvm import te, tirx

from .online_softmax import fast_exp, online_softmax_reducer
from .registry import register_op
from .rope import check_rope_tables, rotary_read

LAYOUTS = ("BSHD", "BHSD")
#: parameters that place Q/K/V's heads inside larger operands ("Head ranges" above), not what is computed
HEAD_RANGE_PARAMS = ("heads", "kv_heads", "q_head_start", "k_head_start", "v_head_start")
ACC = "float32"
#: input types whose matmul operands stay 16-bit (tensor-core friendly): stages ``attn_p16`` and ``attn_vb``
LOW_PRECISION = ("float16", "bfloat16")


#: keys per block when the key count is known only at run time: the static default's cap. Measured on the 2-core
#: box (MiniLM's 12 heads × 32, query tile 16, against the static kernel at each length): 32-key blocks were
#: 1.30× / 1.31× / 1.12× at S = 16 / 128 / 384 (the flash loop's per-block rescale runs 4× as often), 128-key
#: blocks 3.2× / 1.09× / 0.83×. A short request would pay for its padded keys: the CPU build gives the kernel
#: branches with 8-, 32- and 64-key blocks for ≤ 8, ≤ 32 and ≤ 64 keys (:mod:`..compile.variants.short_keys`)
SYMBOLIC_KEY_BLOCK = 128


def default_key_block(num_keys: int) -> int:
    """Power of two ≤ 128 covering short sequences without much padding.

    128 keys × 64 head dims of K and V (64 KiB fp32) plus a 32-row score tile stay in one core's L2, and the
    per-block rescale of the running state is then under 1/128 of the block's FMAs. Measured on the 2-core
    AVX2 box (12 heads, d 64): 128 beats 64 by 5–10 % at S = T = 512…2048.
    """
    kb = 8
    while kb < min(num_keys, 128):
        kb *= 2
    return kb


def _dims(t, layout: str):
    """(B, H, S, D) of a 4-D tensor in ``layout``."""
    b, x1, x2, d = t.shape
    return (b, x1, x2, d) if layout == "BHSD" else (b, x2, x1, d)


def head_axis(layout: str) -> int:
    """The heads' axis of a 4-D operand in ``layout``."""
    return 1 if layout == "BHSD" else 2


def head_ranges(params: dict, extents: dict) -> dict:
    """``{"q" | "k" | "v": (start, count)}``: the heads each operand contributes ("Head ranges" above), given the
    operator's parameters and each operand's head extent (``{"q": 36, "k": 36, "v": 36}``)."""
    starts = {n: int(params.get(f"{n}_head_start") or 0) for n in "qkv"}
    heads, kv_heads = params.get("heads"), params.get("kv_heads")
    h = int(heads) if heads is not None else extents["q"] - starts["q"]
    hkv = int(kv_heads) if kv_heads is not None else extents["k"] - starts["k"]
    return {"q": (starts["q"], h), "k": (starts["k"], hkv), "v": (starts["v"], hkv)}


def _at(t, layout: str, b, h, s, d, head_start: int = 0):
    h = h + head_start if head_start else h
    return t[b, h, s, d] if layout == "BHSD" else t[b, s, h, d]


@register_op("fused_attention", inputs=("q", "k", "v", "mask", "q_cos", "q_sin", "k_cos", "k_sin", "cu_seqlens",
                                       "row_seq", "key_bias"))
def fused_attention(q, k, v, mask=None, q_cos=None, q_sin=None, k_cos=None, k_sin=None, cu_seqlens=None,
                    row_seq=None, key_bias=None, *, scale: float,
                    causal: bool = False, q_layout: str = "BSHD", k_layout: str = "BSHD", v_layout: str = "BSHD",
                    out_layout: str = "BSHD", key_block: Optional[int] = None, q_rope: str = "none",
                    k_rope: str = "none", query_block: Optional[int] = None, softcap: float = 0.0,
                    heads: Optional[int] = None, kv_heads: Optional[int] = None, q_head_start: int = 0,
                    k_head_start: int = 0, v_head_start: int = 0, split_blocks: Optional[int] = None,
                    preallocated_kv: bool = False):
    for name, lay in (("q", q_layout), ("k", k_layout), ("v", v_layout), ("out", out_layout)):
        if lay not in LAYOUTS:
            raise ValueError(f"fused_attention: {name}_layout must be one of {LAYOUTS}, got '{lay}'")
    B, QH, S, D = (_dim(x) for x in _dims(q, q_layout))
    T, KH = _dim(_dims(k, k_layout)[2]), _dim(_dims(k, k_layout)[1])
    cache_len = T  # K's and V's own key axis: the keys in use, or (preallocated) the cache's capacity
    if preallocated_kv:
        if mask is None or k_rope != "none" or cu_seqlens is not None:
            raise ValueError("fused_attention: preallocated_kv needs a mask (its last dim counts the keys), "
                             "no rotary tables for K and no packed form")
        T = _dim(mask.shape[-1])
    VH = _dim(_dims(v, v_layout)[1])
    if not all(isinstance(x, int) for x in (QH, D, KH, VH)):
        raise ValueError(f"fused_attention: heads and head dim must be static, got q {list(q.shape)} {q_layout}, "
                         f"k {list(k.shape)} {k_layout}")
    # Each operand may hold more heads than it contributes: Q, K and V read as head ranges of one projection
    # output (transform/attention_qkv_heads.py), so the split that would copy them apart never runs.
    extents = {"q": QH, "k": KH, "v": VH}
    ranges = head_ranges({"heads": heads, "kv_heads": kv_heads, "q_head_start": q_head_start,
                          "k_head_start": k_head_start, "v_head_start": v_head_start}, extents)
    H, HKV = ranges["q"][1], ranges["k"][1]
    for name, (start, count) in ranges.items():
        extent = extents[name]
        if start < 0 or count <= 0 or start + count > extent:
            raise ValueError(f"fused_attention: {name} heads [{start}, {start + count}) are not within its "
                             f"{extent} heads")
    if kv_heads is None and VH - v_head_start != HKV:
        raise ValueError("fused_attention: q, k, v shapes disagree "
                         f"({list(q.shape)} {q_layout}, {list(k.shape)} {k_layout}, {list(v.shape)} {v_layout}; "
                         "V's heads differ from K's)")
    # V's head dim is its own (DV): the output takes it; only q·kᵀ needs q and k to agree (MLA, LeViT)
    DV = _dim(_dims(v, v_layout)[3])
    if (not isinstance(DV, int) or not _same_dims(_dims(k, k_layout), [B, KH, cache_len, D])
            or not _same_dims(_dims(v, v_layout), [B, VH, cache_len, DV]) or H % HKV):
        raise ValueError("fused_attention: q, k, v shapes disagree "
                         f"({list(q.shape)} {q_layout}, {list(k.shape)} {k_layout}, {list(v.shape)} {v_layout}; "
                         "K/V heads must divide Q heads)")
    group = H // HKV  # query heads per K/V head
    check_rope_tables("fused_attention", "q", q_rope, q_cos, q_sin, B, S, D)
    check_rope_tables("fused_attention", "k", k_rope, k_cos, k_sin, B, T, D)
    if mask is not None and len(mask.shape) > 4:
        raise ValueError(f"fused_attention: mask rank must be <= 4, got {len(mask.shape)}")
    if mask is not None and str(mask.dtype) == "bool":
        # an additive mask: a boolean one would be added as 0/1 (convert with where(m, 0, -inf) first)
        raise ValueError("fused_attention: mask must be additive (float), got bool")

    varlen = _check_varlen(cu_seqlens, row_seq, key_bias, mask, B, S, T, q_rope, k_rope)
    if mask is not None:
        want = (B, H, S, T)[4 - len(mask.shape):]
        if any(not (_dim(e) == 1 or _same_dims([e], [w])) for e, w in zip(mask.shape, want)):
            raise ValueError(f"fused_attention: mask {list(mask.shape)} does not broadcast to {[B, H, S, T]}")
    symbolic = not all(isinstance(x, int) for x in (B, S, T))
    # the keys a row visits: T of its batch, or (varlen) L of its sequence, cut into blocks per sequence
    num_seq, span = (key_bias.shape[0], _dim(key_bias.shape[1])) if varlen else (B, T)
    symbolic = symbolic or not isinstance(span, int)
    if symbolic:
        # symbolic dims are int64: every static extent joins them in int64 (TIR refuses mixed index types, and
        # an int32 axis cast from an int64 loop is not an affine binding the schedules can work with)
        B, S, T, H, HKV, D, DV, span = (tirx.IntImm("int64", x) if isinstance(x, int) else x
                                        for x in (B, S, T, H, HKV, D, DV, span))
    # preallocated K/V: keys are clamped into the cache too, so a key count past its capacity (a caller that
    # skipped the run-time checks) reads in bounds; T <= capacity otherwise, and the clamp is T - 1 as before
    last = _last_key(T, cache_len if preallocated_kv else None, symbolic)
    if split_blocks is not None:
        return _decode_form(q, k, v, mask, q_cos, q_sin, k_cos, k_sin, q_layout, k_layout, v_layout, q_rope, k_rope,
                            q_head_start, k_head_start, v_head_start, varlen=varlen, B=B, S=S, T=T, H=H, HKV=HKV, D=D,
                            DV=DV, scale=scale, softcap=softcap, causal=causal, out_layout=out_layout,
                            key_block=key_block, split_blocks=split_blocks, symbolic=symbolic,
                            last=last if preallocated_kv else None)
    kb = int(key_block or (default_key_block(span) if not symbolic else SYMBOLIC_KEY_BLOCK))
    if kb <= 0 or kb & (kb - 1):
        raise ValueError(f"fused_attention: key_block must be a power of two, got {kb}")
    whole_blocks = not varlen and isinstance(_dim(T), int) and _dim(T) % kb == 0
    if symbolic:
        kb = tirx.IntImm("int64", kb)
    nb = (span + kb - 1) // kb
    # Queries known only at run time, with query_block: every stage runs over the rows padded to a multiple
    # of query_block (padding rows read the last real query), so a template tiles them with no tail inside
    # the flash loop; only the final write-back (attn_out) is bounded by the real rows.
    # Static rows are padded too when they do not fill whole tiles (a template asked for it: ViT's 197 rows).
    padded_rows = query_block is not None and (not isinstance(_dim(S), int) or _dim(S) % int(query_block) != 0)
    if padded_rows:
        qb = int(query_block)
        if qb <= 0:
            raise ValueError(f"fused_attention: query_block must be positive, got {qb}")
        rows = (S + (qb - 1)) // qb * qb
        q_row = lambda i: tirx.min(i, S - 1)  # noqa: E731
    else:
        rows = S
        q_row = lambda i: i  # noqa: E731
    f32 = lambda x: tirx.const(x, ACC)  # noqa: E731
    lowest = tirx.min_value(ACC)
    neg_inf = f32(float("-inf"))

    # 16-bit inputs keep K, V and the probabilities in their own type for the two matmuls (fp32 accumulation),
    # as flash attention does: that is what tensor cores multiply. fp32 inputs are unchanged.
    low = str(q.dtype) in LOW_PRECISION
    operand = str(q.dtype) if low else ACC

    def key(jb, jj, n=None):
        # padded keys past T read the last key (in bounds); their score is -inf so they weigh nothing.
        # 16-bit inputs without padding keep the index affine, so the tensor-core template can read K and V
        # in place (fp32 keeps its form: tuning records name the PrimFunc by its structure).
        if varlen:  # the packed row of sequence n's key jb·kb + jj, clamped the same way
            return tirx.min(seq_start(n) + jb * kb + jj, last)
        return jb * kb + jj if low and whole_blocks else tirx.min(jb * kb + jj, last)

    index = "int64" if symbolic else "int32"

    def seq_start(n):
        return cu_seqlens[n].astype(index)

    def seq_len(n):
        return (cu_seqlens[n + 1] - cu_seqlens[n]).astype(index)

    def seq_of(i):
        """The K/V blocks a packed query row reads: those of its sequence."""
        return row_seq[q_row(i)].astype(index)

    def kv_read(n, read):
        """``read()`` of a K/V element for a key block of sequence ``n``; no load at all for an empty
        sequence: with every sequence empty (T = 0) there is no row to clamp to."""
        return tirx.if_then_else(seq_len(n) > 0, read(), tirx.const(0, operand)) if varlen else read()

    def kv_head(h):
        return h // group if group > 1 else h

    def k_at(b, hk, j, d):
        return _at(k, k_layout, b, hk, j, d, k_head_start)

    k_read = rotary_read(k_at, k_cos, k_sin, k_rope, D) if k_rope != "none" else k_at
    # K/V stages are per K/V head: GQA reads them at kv_head(h), they are never repeated per query head
    kt = te.compute((num_seq if varlen else B, HKV, nb, D, kb),
                    lambda b, hk, jb, d, jj: kv_read(b, lambda: k_read(0 if varlen else b, hk, key(jb, jj, b), d)
                                                     .astype(operand)),
                    name="attn_kt", attrs={"schedule_rule": "None"})
    if q_rope != "none":
        rotate_q = rotary_read(lambda b, h, i, d: _at(q, q_layout, b, h, i, d, q_head_start), q_cos, q_sin,
                               q_rope, D)
        qr = te.compute((B, H, rows, D), lambda b, h, i, d: rotate_q(b, h, q_row(i), d).astype(operand),
                        name="attn_qr", attrs={"schedule_rule": "None"})
        q_read = lambda b, h, i, d: qr[b, h, i, d]  # noqa: E731
    else:
        q_read = lambda b, h, i, d: _at(q, q_layout, b, h, q_row(i), d, q_head_start)  # noqa: E731
    rd = te.reduce_axis((0, D), name="rd")
    qk = te.compute((B, H, rows, nb, kb), lambda b, h, i, jb, jj: te.sum(
        q_read(b, h, i, rd).astype(ACC) * kt[seq_of(i) if varlen else b, kv_head(h), jb, rd, jj].astype(ACC),
        axis=rd),
        name="attn_qk", attrs={"schedule_rule": "None"})

    def score(b, h, i, jb, jj):
        j = jb * kb + jj
        s = qk[b, h, i, jb, jj] * f32(scale)
        if softcap:
            s = f32(softcap) * tirx.tanh(s * f32(1.0 / softcap))
        if varlen:
            n = seq_of(i)
            s = s + key_bias[n, tirx.min(j, span - 1)].astype(ACC)
            visible = j < seq_len(n)
            if causal:  # positions within the sequence: packing keeps each sequence's order
                visible = tirx.all(visible, j <= q_row(i) - seq_start(n))
            return tirx.Select(visible, s, neg_inf)
        if mask is not None:
            full = (b, h, q_row(i), tirx.min(j, last))[4 - len(mask.shape):]
            s = s + mask[tuple(0 if _dim(e) == 1 else ix for e, ix in zip(mask.shape, full))].astype(ACC)
        visible = j < T
        if causal:
            visible = tirx.all(visible, j <= i + (T - S))
        return tirx.Select(visible, s, neg_inf)

    jj1 = te.reduce_axis((0, kb), name="jj1")
    bmax = te.compute((B, H, rows, nb), lambda b, h, i, jb: te.max(score(b, h, i, jb, jj1), axis=jj1),
                      name="attn_bmax", attrs={"schedule_rule": "None"})

    def prob(b, h, i, jb, jj):
        s = score(b, h, i, jb, jj)
        # -inf scores (and NaN) weigh 0; a block of only such keys has bmax = lowest finite, never -inf
        # bind=False: no Let, so MetaSchedule can estimate the kernel's FLOPs and tune it (its estimator has
        # no rule for Let); the lowering's CSE removes the repeated subexpressions: same output bits and the
        # same speed as the Let form (S=T=128, H=12, D=64, template defaults: 5.54 vs 5.58 ms, noisy 2 cores)
        return tirx.Select(s >= lowest, fast_exp(s - bmax[b, h, i, jb], bind=False), f32(0.0))

    p = te.compute((B, H, rows, nb, kb), prob, name="attn_p", attrs={"schedule_rule": "None"})
    jj2 = te.reduce_axis((0, kb), name="jj2")
    jj3 = te.reduce_axis((0, kb), name="jj3")
    if low:
        # p rounded once; the block sum adds the very values the second matmul multiplies, so the
        # normalisation matches the numerator. V is copied into key blocks like K (clamped padding keys).
        p16 = te.compute((B, H, rows, nb, kb), lambda *ix: p(*ix).astype(operand), name="attn_p16",
                         attrs={"schedule_rule": "None"})
        vb = te.compute((num_seq if varlen else B, HKV, nb, kb, DV), lambda b, hk, jb, jj, d: kv_read(
            b, lambda: _at(v, v_layout, 0 if varlen else b, hk, key(jb, jj, b), d, v_head_start).astype(operand)),
            name="attn_vb", attrs={"schedule_rule": "None"})
        bsum = te.compute((B, H, rows, nb), lambda b, h, i, jb: te.sum(p16[b, h, i, jb, jj2].astype(ACC), axis=jj2),
                          name="attn_bsum", attrs={"schedule_rule": "None"})
        bo = te.compute((B, H, rows, nb, DV), lambda b, h, i, jb, d: te.sum(
            p16[b, h, i, jb, jj3].astype(ACC) * vb[seq_of(i) if varlen else b, kv_head(h), jb, jj3, d].astype(ACC),
            axis=jj3),
            name="attn_bo", attrs={"schedule_rule": "None"})
    else:
        bsum = te.compute((B, H, rows, nb), lambda b, h, i, jb: te.sum(p[b, h, i, jb, jj2], axis=jj2),
                          name="attn_bsum", attrs={"schedule_rule": "None"})
        bo = te.compute((B, H, rows, nb, DV), lambda b, h, i, jb, d: te.sum(
            p[b, h, i, jb, jj3] * _at(v, v_layout, b, kv_head(h), key(jb, jj3, seq_of(i) if varlen else None),
                                      d, v_head_start).astype(ACC), axis=jj3),
            name="attn_bo", attrs={"schedule_rule": "None"})

    online = online_softmax_reducer()
    rb = te.reduce_axis((0, nb), name="rb")
    _, run_sum, run_out = te.compute(
        (B, H, rows, DV),
        lambda b, h, i, d: online((bmax[b, h, i, rb], bsum[b, h, i, rb], bo[b, h, i, rb, d]), axis=rb),
        name="attn_online", attrs={"schedule_rule": "None"})

    def finish(b, h, i, d):
        l_ = run_sum[b, h, i, d]
        # l == 0 only for rows without a visible key: define them as 0 instead of 0/0
        return tirx.Select(l_ > f32(0.0), run_out[b, h, i, d] / l_, f32(0.0)).astype(q.dtype)

    out_rule = "tfx.attention"
    if padded_rows:
        # the anchor finishes every padded row (BHSD); attn_out copies the real rows out, in the output layout
        done = te.compute((B, H, rows, DV), finish, name="attn_rows", attrs={"schedule_rule": "tfx.attention"})
        finish, out_rule = (lambda b, h, i, d: done[b, h, i, d]), "None"
    if out_layout == "BHSD":
        return te.compute((B, H, S, DV), finish, name="attn_out", attrs={"schedule_rule": out_rule})
    return te.compute((B, S, H, DV), lambda b, i, h, d: finish(b, h, i, d), name="attn_out",
                      attrs={"schedule_rule": out_rule})


def _decode_form(q, k, v, mask, q_cos, q_sin, k_cos, k_sin, q_layout, k_layout, v_layout, q_rope, k_rope,
                 q_head_start, k_head_start, v_head_start, *, varlen, B, S, T, H, HKV, D, DV, scale, softcap, causal,
                 out_layout, key_block, split_blocks, symbolic, last=None):
    """``split_blocks`` given: the split-K decode form (:mod:`.decode_attention`) for one query row."""
    from .decode_attention import DecodeOperands, decode_attention, decode_key_block

    if varlen:
        raise ValueError("fused_attention: the decode form (split_blocks) does not take the packed form")
    if isinstance(_dim(S), int) and _dim(S) != 1:
        raise ValueError(f"fused_attention: the decode form (split_blocks) takes one query row, got {_dim(S)}")
    sb = int(split_blocks)
    kb = int(key_block or decode_key_block(_dim(T)))
    if sb <= 0 or kb <= 0 or kb & (kb - 1):
        raise ValueError(f"fused_attention: the decode form needs a positive split_blocks and a power-of-two "
                         f"key_block, got {sb} and {kb}")
    zero = tirx.IntImm("int64" if symbolic else "int32", 0)

    def q_at(b, h, i, d):
        return _at(q, q_layout, b, h, i, d, q_head_start)

    def k_at(b, hk, j, d):
        return _at(k, k_layout, b, hk, j, d, k_head_start)

    q_read = rotary_read(q_at, q_cos, q_sin, q_rope, D) if q_rope != "none" else q_at
    k_read = rotary_read(k_at, k_cos, k_sin, k_rope, D) if k_rope != "none" else k_at

    def mask_read(b, h, j):
        full = (b, h, zero, j)[4 - len(mask.shape):]
        return mask[tuple(0 if _dim(e) == 1 else ix for e, ix in zip(mask.shape, full))]

    operands = DecodeOperands(q=lambda b, h, d: q_read(b, h, zero, d), k=k_read,
                              v=lambda b, hk, j, d: _at(v, v_layout, b, hk, j, d, v_head_start),
                              mask=mask_read if mask is not None else None,
                              mask_per_head=mask is not None and len(mask.shape) >= 3 and _dim(mask.shape[-3]) != 1)
    return decode_attention(operands, B=B, S=S, T=T, H=H, HKV=HKV, D=D, DV=DV, scale=scale, softcap=softcap,
                            causal=causal, out_layout=out_layout, out_dtype=str(q.dtype), key_block=kb,
                            split_blocks=sb, symbolic=symbolic, last_key=last)


def _last_key(T, capacity, symbolic: bool):
    """The last key index a read may take: ``T - 1``, or ``min(T, capacity) - 1`` for a preallocated cache."""
    if capacity is None:
        return T - 1
    if isinstance(_dim(T), int) and isinstance(_dim(capacity), int):
        return min(_dim(T), _dim(capacity)) - 1
    if symbolic and isinstance(capacity, int):
        capacity = tirx.IntImm("int64", capacity)
    return tirx.min(T, capacity) - tirx.IntImm(str(T.ty) if hasattr(T, "ty") else "int64", 1)


def _check_varlen(cu_seqlens, row_seq, key_bias, mask, B, S, T, q_rope, k_rope) -> bool:
    """Whether this is the packed form; its inputs checked (all three or none, one batch of packed rows)."""
    given = [x is not None for x in (cu_seqlens, row_seq, key_bias)]
    if not any(given):
        return False
    if not all(given):
        raise ValueError("fused_attention: the packed form needs cu_seqlens, row_seq and key_bias together")
    if mask is not None or q_rope != "none" or k_rope != "none":
        raise ValueError("fused_attention: the packed form takes key_bias instead of a mask, and no rotary tables")
    if _dim(B) != 1 or not _same_dims([S], [T]):
        raise ValueError(f"fused_attention: packed Q/K/V must be one batch of the same rows, got batch {B}, "
                         f"{S} query rows, {T} key rows")
    if len(cu_seqlens.shape) != 1 or len(row_seq.shape) != 1 or len(key_bias.shape) != 2 or \
            not _same_dims([cu_seqlens.shape[0]], [key_bias.shape[0] + 1]) or not _same_dims([row_seq.shape[0]], [S]):
        raise ValueError(f"fused_attention: packed form wants cu_seqlens [N+1], row_seq [T], key_bias [N, L]; got "
                         f"{list(cu_seqlens.shape)}, {list(row_seq.shape)}, {list(key_bias.shape)} for T = {S}")
    if any(str(x.dtype) not in ("int32", "int64") for x in (cu_seqlens, row_seq)):
        raise ValueError("fused_attention: cu_seqlens and row_seq must be int32 or int64")
    return True


def _dim(x):
    """A static dimension as ``int``; a symbolic one as it is."""
    return int(x) if isinstance(x, (int, tirx.IntImm)) else x


def _same_dims(a, b) -> bool:
    from tvm import sym

    analyzer = sym.Analyzer()
    return len(a) == len(b) and all(
        _dim(x) == _dim(y) if isinstance(_dim(x), int) and isinstance(_dim(y), int)
        else analyzer.can_prove_equal(x, y) for x, y in zip(a, b))


def key_geometry(func) -> tuple:
    """``(S, T, key_block)`` of a ``fused_attention`` PrimFunc (the build path's passes need the causal diagonal
    and the key blocking of a kernel without re-deriving the operator); S and T are ``int`` or the kernel's
    own symbolic dims."""
    from .registry import inputs_of, params_of

    params = params_of(func)
    buffers = {name: p.ty for name, p in zip(inputs_of(func), func.params)}  # 0.27: a parameter's type is its buffer
    S = _dim(_dims(buffers["q"], params.get("q_layout", "BSHD"))[2])
    T = (_dim(buffers["mask"].shape[-1]) if params.get("preallocated_kv")
         else _dim(_dims(buffers["k"], params.get("k_layout", "BSHD"))[2]))
    default = default_key_block(T) if isinstance(T, int) else SYMBOLIC_KEY_BLOCK
    return S, T, int(params.get("key_block") or default)


def call_keys(inputs: dict, params: dict):
    """The key count of a ``fused_attention`` call (its inputs' Relax types by name): K's key axis, or the
    mask's last dim for preallocated K/V (a cache longer than the keys in use)."""
    if params.get("preallocated_kv"):
        return inputs["mask"].ty.shape[-1]
    return inputs["k"].ty.shape[2 if params.get("k_layout", "BSHD") == "BHSD" else 1]
