"""FuseMultiHeadAttention: ``softmax(scale · q kᵀ + mask) v`` with its head split/merge → one ``fused_attention``.

Pattern (matched by meaning, not by listing spellings: :class:`AttentionMatcher`)
    ``matmul(P, v)`` where ``P`` is ``softmax(X, axis=-1)`` or the SDPA NaN guard around it
    (``where(isnan(p), 0, p)``), optionally followed by permute/reshape ops (the head merge), and
    ``X`` is ``matmul(q, k)`` under any mix of scalar scales (multiply/divide, either side), additive masks and
    reshapes that regroup the scores' (B, H, S, T) axes (BLOOM adds its ALiBi bias to ``[B·H, S, T]`` scores, then
    views them as ``[B, H, S, T]`` for the padding mask).
    ``q``, ``k`` and ``v`` are walked back through permute_dims / reshape / scalar-scale ops to the tensor each
    came from (``attention_operands``); a walk succeeds at the furthest 4-D tensor whose axes, read as BSHD or
    BHSD, reach the matmul operand as (B, H | S, D) for q, (B, H | D, T) for k, (B, H | T, D) for v, without
    passing through a hidden state (an axis merging the head dim with another: ``[B, S, H·D]``), where another
    computation (e.g. the previous layer's head merge) begins. So ``Reshape → Transpose [0,2,1,3]``
    head splits, K via ``[0,2,3,1]``, via ``[0,2,1,3]`` + a last-two-axes transpose, or via the dynamo export's
    ``permute → reshape [B·H,T,D] → permute → reshape`` are one case, as are plain BHSD inputs and 3-D
    ``[B·H, S, D]`` operands (treated as B=1).
Check (a refusal names its reason)
    softmax on the last axis; every scale a scalar constant, or a tensor varying over the heads only (Swin-v2's
    logit scale: applied to q); every mask additive (same float dtype as the scores) and broadcastable to
    (B, H, S, T); q and k head dims (v may have its own, as in MLA and LeViT), key lengths, batch and heads
    consistent; batch dims of the two matmuls not broadcast. Scores and probabilities must not be used elsewhere
    (the engine's leak check: they are the intermediates of the match).
Rewrite
    ``fused_attention(q, k, v, mask?; scale, causal, layouts)`` plus a reshape when the graph wanted another view
    of the output (the ``[B, S, H·D]`` head merge, a 3-D ``[B·H, S, D]`` result). A constant mask equal to
    the causal one (0 where key j <= query i + T - S, <= -1e30 elsewhere) becomes ``causal=True`` so no S×T
    tensor is left for it.

The NaN guard: the operator defines a row with no visible key (all scores -inf) as 0, which is exactly what
``where(isnan(softmax(x)), 0, ·)`` gives for such rows, so the guard is absorbed whatever the mask. (Without a
guard such a row is NaN in the unfused graph and 0 in the fused one: the only place the fused result differs.)
"""

from __future__ import annotations

import dataclasses

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import tvm
from tvm import relax

from ..ops import call_op
from .attention_mask import compact_mask, const_eval, is_causal_mask, split_causal
from .attention_operands import (SCALE_OPS, SHAPE_OPS, Operand, atoms, const_scale, out_layout, regroup,
                                 operand_candidates, scalar_operand)
from .graph import (FunctionGraph, dims_product, explicit_out_dtype, format_dims, op_name, same_dim, same_dims,
                    scalar_value, shape_dims)
from .rule import Found, FusionRule, Match, Matcher, Variant, rule_pass

_MAX_MASKS = 4


@dataclass
class _Plan:
    """What the matcher worked out for the rule: the operands, scale, masks and layouts, or why not."""

    reason: Optional[str] = None
    q: Optional[Operand] = None
    k: Optional[Operand] = None
    v: Optional[Operand] = None
    scale: float = 1.0
    masks: List["_Mask"] = field(default_factory=list)
    #: masks given as a boolean ``keep`` whose causal part was split off: index in ``masks`` -> additive value
    #: of a hidden key
    keep_masks: Dict[int, float] = field(default_factory=dict)
    causal: bool = False
    out_layout: str = "BHSD"
    guard: bool = False
    #: v's key count is a different expression than k's, equal only at run time (an export that names past_key's
    #: and past_value's lengths apart): v is match-cast to k's, which the VM checks on every call
    v_keys_checked: bool = False
    #: a tensor the scores are multiplied (or divided) by, Swin-v2's per-head logit scale; checked to vary over
    #: the heads only, it is applied to q instead, reshaped to ``head_view`` (q's layout, one value per head)
    head_scale: Optional["_HeadScale"] = None
    head_view: Optional[list] = None
    #: the factor ``c`` of soft-capped scores ``c · tanh(a · q kᵀ)`` (Gemma 2: ``cap · tanh(s / cap)``), 0 if none;
    #: the operator's ``softcap``, with ``scale = a · c`` so that ``scale · q kᵀ / softcap`` is ``a · q kᵀ``
    softcap: float = 0.0


@dataclass
class _HeadScale:
    """A tensor factor of the scores, as found under the softmax."""

    expr: relax.Expr
    divide: bool                       # the scores are divided by it
    scores: Optional[list]             # shape of the scores it multiplies (a grouping of (B, H, S, T))
    masks_above: int                   # masks found before it (added after the scaling: not scaled by it)


@dataclass
class _Mask:
    """An additive mask found under the softmax."""

    expr: relax.Expr
    factor: float                      # the scale applied to the scores after it was added
    scores: Optional[list] = None      # shape of the scores it is added to (a grouping of (B, H, S, T))
    view: Optional[list] = None        # [B|1, H|1, S|1, T|1] when the operator must see it reshaped, else None
    tile: Optional[list] = None        # a shape to broadcast it to before that reshape (it repeats over part of B)


# ---------------------------------------------------------------------------------------------------
# the matcher
# ---------------------------------------------------------------------------------------------------

class AttentionMatcher(Matcher):
    """``softmax(…) · v`` found by meaning, at the matmul or at the end of the head merge after it.

    It covers the bindings of scores, probabilities and the output chain (so the engine's leak check and
    claiming see them) and hands the rule its :class:`_Plan` as ``m["plan"]``. Operand chains (head split
    permutes, Q-side scales) are not covered: if something else uses them they simply stay.
    """

    def __init__(self, with_out_chain: bool):
        self.with_out_chain = with_out_chain

    def match(self, root: relax.Var, graph: FunctionGraph) -> Optional[Found]:
        out_chain, covered = [], []
        cur = graph.var2val[root]
        while op_name(cur) in SHAPE_OPS:
            out_chain.append(cur)
            covered += graph.chain(cur.args[0])
            cur = graph.value(cur.args[0])
        if bool(out_chain) != self.with_out_chain or op_name(cur) != "relax.matmul":
            return None
        mm = cur
        p_expr = mm.args[0]
        p = graph.value(p_expr)
        covered += graph.chain(p_expr)
        p = _through_reshapes(p, graph, covered)  # the legacy export's [B, H, S, T] -> [B·H, S, T] (checked later)
        guard = False
        if op_name(p) == "relax.where" and op_name(graph.value(p.args[0])) == "relax.isnan":
            isnan = graph.value(p.args[0])
            sm = graph.value(p.args[2])
            zero = scalar_value(graph.value(p.args[1]))
            if zero != 0.0 or not graph.value(isnan.args[0]).same_as(sm):
                return None
            covered += graph.chain(p.args[0]) + graph.chain(p.args[2])
            p, guard = _through_reshapes(sm, graph, covered), True
        if op_name(p) != "relax.nn.softmax":
            return None
        plan = _Plan(guard=guard)
        qk = _walk_scores(p.args[0], graph, plan, covered)
        if qk is None:
            return None  # no q·kᵀ under the softmax: not attention
        plan.reason = plan.reason or _analyse(plan, p, qk, mm, out_chain, graph)
        if plan.reason is not None and out_chain:
            return None  # refuse once, at the matmul itself, not at every binding of the head merge
        exprs = {"mm": mm, "plan": plan}
        exprs.update({f"mask{i}": mask.expr for i, mask in enumerate(plan.masks)})
        exprs.update({name: op.base for name, op in (("q", plan.q), ("k", plan.k), ("v", plan.v)) if op is not None})
        if plan.head_scale is not None:
            exprs["head_scale"] = plan.head_scale.expr
        return Found(exprs, covered)


def _through_reshapes(value, graph: FunctionGraph, covered: list):
    """The value under any reshapes of the probabilities; whether each regroups (B, H, S, T) with the keys last
    is checked once the operands say what B, H, S and T are."""
    while op_name(value) == "relax.reshape":
        covered += graph.chain(value.args[0])
        value = graph.value(value.args[0])
    return value


#: elementwise functions that can sit between q·kᵀ and the softmax but are no scale or mask. One tanh is logit
#: soft-capping (Gemma 2's ``cap · tanh(s / cap)``, whatever factors surround it), which the operator computes;
#: a match through any other is refused, with the function named (not silently skipped).
_SCORE_NONLINEAR = ("relax.tanh", "relax.sigmoid", "relax.exp", "relax.log", "relax.erf", "relax.abs", "relax.clip")


def _leads_to_matmul(e, graph: FunctionGraph, depth=0) -> bool:
    v = graph.value(e)
    op = op_name(v)
    if op == "relax.matmul":
        return True
    if depth < 8 and op in ("relax.add", "relax.reshape", *SCALE_OPS, *_SCORE_NONLINEAR):
        return any(_leads_to_matmul(a, graph, depth + 1) for a in v.args)
    return False


def _walk_scores(x, graph: FunctionGraph, plan: _Plan, covered: list) -> Optional[relax.Call]:
    """From the softmax input down to q·kᵀ, collecting scales and masks; None if there is no q·kᵀ."""
    factor = 1.0
    capped = False  # below a soft-capping tanh: what is found now is inside it
    cur = x
    while True:
        covered.extend(graph.chain(cur))
        val = graph.value(cur)
        op = op_name(val)
        if op == "relax.matmul":
            plan.scale *= factor
            return val
        if op == "relax.add":
            a, b = val.args
            if _leads_to_matmul(a, graph):
                cur, mask = a, b
            elif _leads_to_matmul(b, graph):
                cur, mask = b, a
            else:
                return None
            if capped:
                plan.reason = plan.reason or "a mask is added inside the soft-capping tanh (the operator caps the " \
                                             "scaled scores, then adds the masks)"
            plan.masks.append(_Mask(mask, factor, shape_dims(val)))
            continue
        if op == "relax.reshape" and _leads_to_matmul(val.args[0], graph):
            # a regrouping of the scores' axes (checked in _analyse_masks / _analyse): masks below it are added
            # to the scores in the shape they have there
            cur = val.args[0]
            continue
        if op in SCALE_OPS:
            so = scalar_operand(val)
            if so is None:
                idx = next((i for i in (0, 1) if _leads_to_matmul(val.args[i], graph)), None)
                if idx is None:
                    return None
                divide = op_name(val) == "relax.divide"
                if (divide and idx != 0) or plan.head_scale is not None:
                    plan.reason = plan.reason or "scores are multiplied by a tensor, not a scalar scale"
                else:  # a per-head scale, if it varies over the heads only (checked in _analyse)
                    plan.head_scale = _HeadScale(val.args[1 - idx], divide, shape_dims(val), len(plan.masks))
                cur = val.args[idx]
                continue
            c = const_scale(val, so[1], graph)
            if c is None:
                plan.reason = plan.reason or "scale is not a scalar constant"
                c = 1.0
            factor *= c
            cur = val.args[so[0]]
            continue
        if op == "relax.tanh" and not capped and plan.head_scale is None and _leads_to_matmul(val.args[0], graph):
            # c · tanh(a · q kᵀ): the factors found so far are c, those below it a (plan.scale takes a; _analyse
            # multiplies in c). Masks found so far were added outside the tanh, as the operator adds them.
            if factor == 0.0:
                plan.reason = plan.reason or "the soft-capped scores are multiplied by 0"
            plan.softcap, factor, capped = factor, 1.0, True
            cur = val.args[0]
            continue
        if op in _SCORE_NONLINEAR and _leads_to_matmul(val.args[0], graph):
            plan.reason = plan.reason or f"the scores pass through {op[len('relax.'):]} before the softmax" \
                                         f"{' (besides one soft-capping tanh)' if op == 'relax.tanh' else ''}: " \
                                         f"not plain attention"
            cur = val.args[0]
            continue
        return None


# ---------------------------------------------------------------------------------------------------
# the check, worked out while matching
# ---------------------------------------------------------------------------------------------------


def _agreeing(candidates, q):
    """The first K/V reading whose batch and (grouped) heads are Q's, else the first one (whose mismatch the
    caller then reports); None when there is none."""
    first = None
    for op in candidates:
        first = first or op
        if q is None:
            break
        if same_dims([q.bhsd[0], q.bhsd[1]], [op.bhsd[0], op.bhsd[1] * op.group]):
            return op
        if op.bhsd[1] * op.group == 1 and same_dim(q.bhsd[0], op.bhsd[0]):
            # one K/V head that the matmul broadcasts over every query head (multi-query attention written
            # without a repeat, as Falcon's SDPA export is): a group of all the query heads
            return dataclasses.replace(op, group=q.bhsd[1])
    return first


def _analyse(plan: _Plan, sm, qk, mm, out_chain, graph: FunctionGraph) -> Optional[str]:
    # q·kᵀ, the softmax's input and the second matmul's left operand have one shape unless reshapes regroup
    # (B, H, S, T) between them (BLOOM's exports: [B·H, S, T] and [B, H, S, T])
    scores_shape, softmax_shape, probs_shape = shape_dims(qk), shape_dims(sm.args[0]), shape_dims(mm.args[0])
    if scores_shape is None or softmax_shape is None or probs_shape is None or shape_dims(mm) is None:
        return "shapes are unknown (rank only)"
    axis = int(sm.attrs.axis)
    if axis not in (-1, len(softmax_shape) - 1):
        return f"softmax is over axis {axis}, not the key axis (last)"
    for shape in (scores_shape, softmax_shape, probs_shape):
        if len(shape) not in (3, 4):
            return f"scores have rank {len(shape)} (expected 3 or 4)"
    for mmc in (qk, mm):
        out_dtype = explicit_out_dtype(mmc)
        if out_dtype not in (None, str(mmc.args[0].ty.dtype)):
            return f"a matmul changes dtype to {out_dtype}"
    why: List[str] = []
    # q's reading sets B and H for k and v: one with static heads (what the operator needs) where there is one
    q_readings = list(operand_candidates(qk.args[0], graph, "q", why))
    plan.q = next((c for c in q_readings if isinstance(c.bhsd[1], int)), q_readings[0] if q_readings else None)
    plan.k = _agreeing(operand_candidates(qk.args[1], graph, "k", why), plan.q)
    plan.v = _agreeing(operand_candidates(mm.args[1], graph, "v", why), plan.q)
    for name in ("q", "k", "v"):
        if getattr(plan, name) is None:
            return why[0] if why else f"{name} is not a head-split view of a [B,S,H,D] / [B,H,S,D] tensor"
    (bq, hq, s, dq), (bk, hk, t, dk), (bv, hv, tv, dv) = plan.q.bhsd, plan.k.bhsd, plan.v.bhsd
    if not all(isinstance(x, int) for x in (hq, hk, hv, dq, dk, dv)):
        return "heads or head dim are symbolic (the operator needs them static)"
    if dq != dk:
        return f"q head dim {dq} differs from k head dim {dk}"
    if not same_dim(t, tv):
        if isinstance(t, int) and isinstance(tv, int):
            return f"k has {t} keys, v has {tv}"
        # the second matmul multiplies over both, so they are equal whenever the graph runs at all
        plan.v_keys_checked = True
    gk, gv = plan.k.group, plan.v.group
    if not same_dims([bq, hq], [bk, hk * gk]) or not same_dims([bq, hq], [bv, hv * gv]):
        return f"batch/heads differ: q {format_dims([bq, hq])}, k {format_dims([bk, hk * gk])}, " \
               f"v {format_dims([bv, hv * gv])}"
    if hk != hv:
        return f"k has {hk} heads before its repeat, v has {hv}: the operator reads K and V with one head count"
    for shape in (scores_shape, softmax_shape, probs_shape):
        if not same_dims(shape[-2:], [s, t]) or not same_dim(dims_product(shape), dims_product([bq, hq, s, t])):
            return (f"scores shape {format_dims(shape)} is not (B, H, S, T) = {format_dims([bq, hq, s, t])} "
                    "(broadcast batch dims)")
    dtypes = {str(o.base.ty.dtype) for o in (plan.q, plan.k, plan.v)}
    if len(dtypes) != 1:
        return f"q/k/v dtypes differ: {sorted(dtypes)}"
    if plan.head_scale is not None:
        reason = _per_head_factors(plan, (bq, hq, s, t))
        if reason:
            return reason
    plan.scale *= plan.q.scale * plan.k.scale
    if plan.softcap:
        plan.scale *= plan.softcap
    if not math.isfinite(plan.scale):
        return "scale is not finite"
    reason = _analyse_masks(plan, (bq, hq, s, t), str(qk.ty.dtype), graph)
    if reason:
        return reason
    # output: the matmul's axes, then whatever permute/reshape the graph applied after it
    # (matmul batch axes are the operands' (b then h), however the scores group them)
    scores_dims = regroup(atoms((bq, hq, s, t), ("b", "h", "s", "t")), scores_shape)
    softmax_dims = regroup(atoms((bq, hq, s, t), ("b", "h", "s", "t")), softmax_shape)
    probs_dims = regroup(atoms((bq, hq, s, t), ("b", "h", "s", "t")), probs_shape)
    for shape, dims in ((scores_shape, scores_dims), (softmax_shape, softmax_dims), (probs_shape, probs_dims)):
        if dims is None:
            return f"scores shape {format_dims(shape)} does not group (B, H, S, T) = {format_dims([bq, hq, s, t])}"
    scores_dims = probs_dims  # what the second matmul multiplies
    mm_dims = scores_dims[:-1] + [[("d", dv)] if dv != 1 else []]  # the output has v's head dim
    layout = out_layout(mm_dims, list(reversed(out_chain)))
    if layout is None:
        return "the permutes after the attention are not a head merge"
    plan.out_layout = layout
    return None


def _mask_over_split_batch(mask: _Mask, ms, bhst) -> Optional[str]:
    """Scores viewed as ``[B/n, n, H, S, T]`` (Swin's shifted windows, several images: ``n`` windows per image)
    with a mask that varies over the windows, not the images: the mask is broadcast over the images and read as
    ``[B, H|1, S|1, T|1]`` (its values repeated per image: B·S·T, what the add broadcast to anyway)."""
    b, h, s, t = bhst
    sc = list(mask.scores)
    padded = [1] * (len(sc) - len(ms)) + list(ms)
    if len(sc) != 5 or not same_dim(dims_product(sc[:2]), b) or not same_dims(sc[2:], [h, s, t]) \
            or any(not (isinstance(m, int) and m == 1) and not same_dim(m, g) for m, g in zip(padded, sc)):
        return f"a mask is added to scores of shape {format_dims(sc)}, not a grouping of (B, H, S, T)"
    mask.tile = sc[:2] + padded[2:]
    mask.view = [b] + padded[2:]
    return None


def _mask_over_any_view(mask: _Mask, ms, bhst, reason: str) -> Optional[str]:
    """Scores viewed in a shape that splits S or T (ViTDet's decomposed relative positions: ``[B·H, S, T]`` viewed
    as ``[B·H, qh, qw, kh, kw]``, a bias per query row and key row added there). Only reshapes lie between q·kᵀ
    and the mask (the score walk admits no permute), so the view keeps the scores' row-major order: the mask
    broadcast to the view and reshaped to (B, H, S, T) adds the same value to every score. That tensor is as
    large as the scores, so this is the last reading tried."""
    sc = list(mask.scores)
    padded = [1] * (len(sc) - len(ms)) + list(ms)
    if not same_dim(dims_product(sc), dims_product(list(bhst))) \
            or any(not (isinstance(m, int) and m == 1) and not same_dim(m, g) for m, g in zip(padded, sc)):
        return reason
    mask.tile, mask.view = sc, list(bhst)
    return None


def _per_head_factors(plan: _Plan, bhst) -> Optional[str]:
    """A factor of the scores that varies over the heads only is one factor per query head: the rewrite applies it
    to q (``(c_h q) kᵀ = c_h (q kᵀ)``; rotary Q commutes with it too). One that varies over the batch, queries or
    keys is not a scale (a multiplicative mask), nor is one applied before a mask was added (the mask would be
    scaled per head)."""
    hs = plan.head_scale
    if len(plan.masks) > hs.masks_above:
        return "a mask is added to the scores before they are multiplied by a per-head tensor"
    shape = shape_dims(hs.expr)
    probe = _Mask(hs.expr, 1.0, hs.scores)
    if shape is None or hs.scores is None or len(shape) > len(hs.scores) or not all(isinstance(n, int) for n in shape) \
            or _mask_view(probe, shape, bhst) is not None or probe.tile is not None:
        return "scores are multiplied by a tensor, not a scalar scale"
    view = probe.view or [1] * (4 - len(shape)) + list(shape)
    if any(not (isinstance(n, int) and n == 1) for n in (view[0], view[2], view[3])):
        return "scores are multiplied by a tensor that varies over more than the heads (a multiplicative mask?)"
    heads = view[1]
    plan.head_view = [1, heads, 1, 1] if plan.q.layout == "BHSD" else [1, 1, heads, 1]
    return None


def _analyse_masks(plan: _Plan, bhst, dtype, graph: FunctionGraph) -> Optional[str]:
    b, h, s, t = bhst
    kept: List[_Mask] = []
    for mask in plan.masks:
        ms = shape_dims(mask.expr)
        if ms is None or mask.scores is None:
            return "mask shape is unknown (rank only)"
        if str(mask.expr.ty.dtype) != dtype:
            return f"mask is not additive (dtype {mask.expr.ty.dtype}, scores {dtype})"
        if len(ms) > len(mask.scores):
            return f"mask of rank {len(ms)} does not broadcast to the scores {format_dims(mask.scores)}"
        # a mask of rank 5 is added to a 5-D view of the scores (Swin's shifted windows: [B/nW, nW, H, N, N]):
        # its view below is what it varies over in (B, H, S, T), so the operator reads it reshaped to rank 4
        reason = _mask_view(mask, ms, bhst)
        if reason:
            return reason
        static = isinstance(s, int) and isinstance(t, int) and mask.view is None
        value = const_eval(mask.expr, graph) if static else None
        factor = mask.factor
        if value is not None and factor > 0 and is_causal_mask(value * factor if factor != 1 else value, s, t):
            plan.causal = True
            continue
        split = split_causal(mask.expr, graph, s, t) if static and value is None and factor > 0 else None
        if split is not None:
            plan.causal = True
            keep, neg = split
            plan.keep_masks[len(kept)] = neg
            kept.append(_Mask(keep, factor, mask.scores))
            continue
        kept.append(mask)
    if len(kept) > _MAX_MASKS:
        return f"{len(kept)} additive masks (at most {_MAX_MASKS} are read)"
    plan.masks = kept
    return None


def _mask_view(mask: _Mask, ms, bhst) -> Optional[str]:
    """Which of (B, H, S, T) the mask varies over, read through the scores it is added to (broadcast right-aligned
    there: each of its axes is 1 or the whole scores axis, which may hold several of B, H, S, T). Sets
    ``mask.view`` when the operator, broadcasting the mask right-aligned against (B, H, S, T), would read it
    otherwise (a ``[B·H, 1, T]`` bias: ``[B, H, 1, T]``)."""
    groups = regroup(atoms(bhst, ("b", "h", "s", "t")), mask.scores)
    if groups is None:
        reason = _mask_over_split_batch(mask, ms, bhst)
        if reason is None:
            return None
        return _mask_over_any_view(mask, ms, bhst, reason)
    padded = [1] * (len(mask.scores) - len(ms)) + list(ms)
    sizes = {"b": 1, "h": 1, "s": 1, "t": 1}
    for m_i, g_i, group in zip(padded, mask.scores, groups):
        if isinstance(m_i, int) and m_i == 1:
            continue
        if not same_dim(m_i, g_i):
            return f"mask of shape {format_dims(ms)} does not broadcast to scores {format_dims(mask.scores)}"
        sizes.update(group)
    view = [sizes[label] for label in ("b", "h", "s", "t")]
    mask.view = None if same_dims([1] * (4 - len(ms)) + list(ms), view) else view
    return None


# ---------------------------------------------------------------------------------------------------
# the rule
# ---------------------------------------------------------------------------------------------------

class MultiHeadAttentionRule(FusionRule):
    name = "FuseMultiHeadAttention"
    kind = "attention"

    def variants(self) -> List[Variant]:
        # the head-merge chain first: the engine visits its last binding before the matmul it starts from
        return [Variant(AttentionMatcher(True), tag={"out_chain": True}),
                Variant(AttentionMatcher(False), tag={"out_chain": False}, root_op="relax.matmul")]

    def check(self, m: Match) -> Optional[str]:
        return m["plan"].reason

    def describe(self, m: Match) -> str:
        p: _Plan = m["plan"]
        parts = [f"q {p.q.layout}", f"k {p.k.layout}", f"v {p.v.layout}", f"out {p.out_layout}",
                 f"scale {p.scale:.6g}"]
        if p.k.group > 1:
            parts.append(f"grouped: {p.k.bhsd[1]} K/V heads for {p.q.bhsd[1]} query heads")
        ropes = [name for name in ("q", "k") if getattr(p, name).rope is not None]
        if ropes:
            parts.append(f"rope {' and '.join(ropes)} ({getattr(p, ropes[0]).rope.style})")
        if p.head_view is not None:
            parts.append("per-head scale")
        if p.softcap:
            parts.append(f"softcap {p.softcap:.6g}")
        if p.masks:
            parts.append("mask")
        if p.causal:
            parts.append("causal")
        if p.guard:
            parts.append("nan-guard")
        return ", ".join(parts)

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        p: _Plan = m["plan"]
        inputs: Dict[str, Optional[relax.Expr]] = {}
        for name in ("q", "k", "v"):
            op: Operand = getattr(p, name)
            x = m.arg(name)
            if op.transposed:  # K given transposed per head ([B, H, D, T]): the operator reads it BHSD
                x = bb.emit(relax.op.permute_dims(x, [0, 1, 3, 2]))
            if len(shape_dims(op.base)) == 3:  # a free view as the 4-D tensor the operand reading names
                b, h, s, d = op.bhsd
                if op.seq_first:
                    x = bb.emit(relax.op.permute_dims(x, [1, 0, 2]))
                x = bb.emit(relax.op.reshape(x, [b, h, s, d] if op.layout == "BHSD" else [b, s, h, d]))
            if name == "v" and p.v_keys_checked:
                x = _with_keys_of_k(bb, x, p)
            if name == "q" and p.head_view is not None:
                c = bb.emit(relax.op.reshape(m.arg("head_scale"), p.head_view))
                if str(c.ty.dtype) != str(x.ty.dtype):
                    c = bb.emit(relax.op.astype(c, str(x.ty.dtype)))
                x = bb.emit((relax.op.divide if p.head_scale.divide else relax.op.multiply)(x, c))
            inputs[name] = x
        mask = None
        for i, mk in enumerate(p.masks):
            factor = mk.factor
            if mk.view is not None:  # added to regrouped scores (BLOOM's [B·H, 1, T] ALiBi): the same values
                mi = m.arg(f"mask{i}")
                if mk.tile is not None:
                    mi = bb.emit(relax.op.broadcast_to(mi, relax.ShapeExpr(mk.tile)))
                mi = bb.emit(relax.op.reshape(mi, mk.view))
            else:  # the op broadcasts its mask: pass it at the size it varies over (no S×T tensor left)
                mi = compact_mask(m[f"mask{i}"], m.graph, m.remap, bb)
            if i in p.keep_masks:  # the key-padding part of a causal mask: back to additive, at its own size
                dtype = str(m["mm"].ty.dtype)
                zero, hidden = relax.const(0.0, dtype), relax.const(p.keep_masks[i], dtype)
                mi = bb.emit(relax.op.where(mi, zero, hidden))
            if factor != 1.0:
                mi = bb.emit(relax.op.multiply(mi, relax.const(factor, str(mi.ty.dtype))))
            mask = mi if mask is None else bb.emit(relax.op.add(mask, mi))
        inputs["mask"] = mask
        params = {"scale": float(p.scale), "causal": bool(p.causal), "q_layout": p.q.layout,
                  "k_layout": p.k.layout, "v_layout": p.v.layout, "out_layout": p.out_layout}
        if p.softcap:  # absent otherwise: the PrimFuncs (and the tuning records naming them) stay as they were
            params["softcap"] = float(p.softcap)
        for name in ("q", "k"):
            rope = getattr(p, name).rope
            if rope is not None:  # read rotated by the operator: the standalone fused_rope becomes dead code
                params[f"{name}_rope"] = rope.style
                inputs[f"{name}_cos"], inputs[f"{name}_sin"] = m.remap(rope.cos), m.remap(rope.sin)
        out = call_op(bb, "fused_attention", inputs, params)
        root_shape = shape_dims(m.root_var)
        if not same_dims(_op_out_shape(p), root_shape):
            out = relax.op.reshape(bb.emit(out, name_hint="attn"), root_shape)
        return out


def _with_keys_of_k(bb: relax.BlockBuilder, v: relax.Expr, p: _Plan) -> relax.Expr:
    """``v`` match-cast to k's key count: one length for the operator, and a run-time error, not a read past
    v's end, if the two ever differ."""
    if not isinstance(v, relax.Var):
        v = bb.emit(v)
    dims = list(shape_dims(v))
    dims[2 if p.v.layout == "BHSD" else 1] = p.k.bhsd[2]
    return bb.match_cast(v, relax.TensorType(dims, str(v.ty.dtype)))


def _op_out_shape(p: _Plan) -> list:
    b, h, s, _ = p.q.bhsd
    d = p.v.bhsd[3]
    return [b, h, s, d] if p.out_layout == "BHSD" else [b, s, h, d]


def FuseMultiHeadAttention() -> tvm.transform.Pass:  # noqa: N802  (TVM pass naming)
    return rule_pass("tfx.FuseMultiHeadAttention", [MultiHeadAttentionRule()])
