"""FuseMultiHeadAttention: ``softmax(scale · q kᵀ + mask) v`` with its head split/merge → one ``fused_attention``.

Pattern (matched by meaning, not by listing spellings)
    ``matmul(P, v)`` where ``P`` is ``softmax(X, axis=-1)`` or the SDPA NaN guard around it
    (``where(isnan(p), 0, p)``), optionally followed by permute/reshape ops (the head merge), and
    ``X`` is ``matmul(q, k)`` under any mix of scalar scales (multiply/divide, either side) and additive masks.
    ``q``, ``k`` and ``v`` are walked back through permute_dims / reshape / scalar-scale ops to the tensor each
    came from; a walk succeeds at the furthest 4-D tensor whose axes, read as BSHD or BHSD, reach the matmul
    operand as (B, H | S, D) for q, (B, H | D, T) for k, (B, H | T, D) for v, without passing through a
    hidden state (an axis merging the head dim with another: ``[B, S, H·D]``), where another computation
    (e.g. the previous layer's head merge) begins. So ``Reshape → Transpose [0,2,1,3]``
    head splits, K via ``[0,2,3,1]``, via ``[0,2,1,3]`` + a last-two-axes transpose, or via the dynamo export's
    ``permute → reshape [B·H,T,D] → permute → reshape`` are one case, as are plain BHSD inputs and 3-D
    ``[B·H, S, D]`` operands (treated as B=1).
Check (a refusal names its reason)
    softmax on the last axis; every scale a scalar constant; every mask additive (same float dtype as the
    scores) and broadcastable to (B, H, S, T); q/k/v head dims, key lengths, batch and heads consistent; batch
    dims of the two matmuls not broadcast. Scores and probabilities must not be used elsewhere (the engine's
    leak check: they are the intermediates of the match).
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

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import tvm
from tvm import relax

from ..ops import call_op
from .mask_compaction import compact_mask
from .rule import FusionRule, Match, Variant, int_list, rule_pass, scalar_value, static_shape

#: masks at or below this are "minus infinity" for detecting a causal mask: exp(s + m - max) underflows to
#: exactly 0 in any float type, and s + m == m in fp32 for |s| < 1e22, so the op's -inf is the same thing
CAUSAL_NEG = -1e30

_SHAPE_OPS = ("relax.permute_dims", "relax.reshape")
_LAYOUTS = ("BHSD", "BSHD")
_LABELS = {"BHSD": ("b", "h", "s", "d"), "BSHD": ("b", "s", "h", "d")}


# ---------------------------------------------------------------------------------------------------
# graph reading helpers
# ---------------------------------------------------------------------------------------------------

def _op(e) -> Optional[str]:
    if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op):
        return e.op.name
    return None


def _value(e, var2val):
    """Look through variable bindings (including ``a = b`` aliases) to the bound value."""
    while isinstance(e, relax.Var) and e in var2val:
        e = var2val[e]
    return e


def _bound(e, var2val) -> List[relax.Expr]:
    """Every binding value met when looking through ``e`` (aliases included): the engine's leak check needs
    the value it knows each variable by."""
    out = []
    while isinstance(e, relax.Var) and e in var2val:
        e = var2val[e]
        out.append(e)
    return out


def _scalar_operand(call, var2val) -> Optional[Tuple[int, relax.Expr]]:
    """For a multiply/divide that keeps its tensor operand's shape: (index of the tensor operand, the other)."""
    shape_out = static_shape(call)
    for i in (0, 1):
        other = call.args[1 - i]
        if static_shape(call.args[i]) == shape_out and _numel(static_shape(other)) == 1:
            if _op(call) == "relax.divide" and i == 1:
                continue  # c / x is not a scale of x
            return i, other
    return None


def _numel(shape) -> Optional[int]:
    return None if shape is None else int(np.prod(shape)) if shape else 1


def _const_scale(call, other, var2val) -> Optional[float]:
    c = scalar_value(_value(other, var2val))
    if c is None:
        return None
    if _op(call) == "relax.divide":
        return None if c == 0 else 1.0 / c
    return c


def _const_eval(e, var2val, depth: int = 0) -> Optional[np.ndarray]:
    """Value of an expression computed from constants only (the masks exporters build), else None."""
    e = _value(e, var2val)
    if isinstance(e, tvm.ir.GenericConst):
        return e.value.numpy()
    if depth > 8 or not isinstance(e, relax.Call):
        return None
    op = _op(e)
    if op == "relax.where":
        args = [_const_eval(a, var2val, depth + 1) for a in e.args]
        return None if any(a is None for a in args) else np.where(*args)
    if op == "relax.astype":
        a = _const_eval(e.args[0], var2val, depth + 1)
        return None if a is None else a.astype(str(e.attrs.dtype))
    if op in ("relax.tril", "relax.triu"):
        a = _const_eval(e.args[0], var2val, depth + 1)
        k = e.args[1]
        if a is None or not isinstance(k, tvm.tirx.IntImm):
            return None
        return (np.tril if op == "relax.tril" else np.triu)(a, int(k.value))
    if op in ("relax.reshape", "relax.broadcast_to"):
        a, shape = _const_eval(e.args[0], var2val, depth + 1), static_shape(e)
        if a is None or shape is None:
            return None
        return a.reshape(shape) if op == "relax.reshape" else np.broadcast_to(a, shape)
    if op in ("relax.add", "relax.multiply", "relax.subtract", "relax.logical_and", "relax.logical_or"):
        a, b = (_const_eval(x, var2val, depth + 1) for x in e.args)
        if a is None or b is None:
            return None
        fn = {"relax.add": np.add, "relax.multiply": np.multiply, "relax.subtract": np.subtract,
              "relax.logical_and": np.logical_and, "relax.logical_or": np.logical_or}[op]
        with np.errstate(all="ignore"):
            return fn(a, b)
    if op == "relax.logical_not":
        a = _const_eval(e.args[0], var2val, depth + 1)
        return None if a is None else np.logical_not(a)
    return None


def is_causal_mask(value: np.ndarray, s: int, t: int) -> bool:
    """``value`` (broadcast right-aligned to (…, s, t)) is 0 on visible keys, <= CAUSAL_NEG on hidden ones,
    with the operator's convention: key j is visible to query i iff j <= i + t - s."""
    if value.ndim < 2 or tuple(value.shape[-2:]) != (s, t) or not np.issubdtype(value.dtype, np.floating):
        return False
    hidden = np.arange(t)[None, :] > np.arange(s)[:, None] + (t - s)
    flat = value.reshape(-1, s, t)
    return bool(np.all(flat[:, ~hidden] == 0) and np.all(flat[:, hidden] <= CAUSAL_NEG))


# ---------------------------------------------------------------------------------------------------
# layouts: which axes of a base tensor reach a matmul operand
# ---------------------------------------------------------------------------------------------------

def _atoms(shape, labels):
    """One list of (label, size) per axis; size-1 axes carry no atom (they can move freely)."""
    return [[(lab, n)] if n != 1 else [] for lab, n in zip(labels, shape)]


def _apply(dims, call):
    op = _op(call)
    if op == "relax.permute_dims":
        axes = int_list(call.attrs.axes)
        axes = list(reversed(range(len(dims)))) if axes is None else [a % len(dims) for a in axes]
        return [dims[a] for a in axes]
    if op == "relax.reshape":
        return _regroup(dims, static_shape(call))
    return dims  # scalar scale


def _regroup(dims, shape):
    """The atoms of ``dims`` after a reshape to ``shape``; None if the reshape splits an atom."""
    if shape is None:
        return None
    flat = [a for d in dims for a in d]
    out, i = [], 0
    for n in shape:
        grp, p = [], 1
        while p < n and i < len(flat):
            grp.append(flat[i])
            p *= flat[i][1]
            i += 1
        if p != n:
            return None  # an axis would be split: not a view of whole heads/tokens
        out.append(grp)
    return out if i == len(flat) else None


def _merges_head_dim(dims) -> bool:
    """An axis holds the head dim together with another one: a hidden state, not a per-head view."""
    return any(len(d) > 1 and any(a[0] == "d" for a in d) for d in dims)


def _labels(dims) -> List[str]:
    return [a[0] for d in dims for a in d]


def _role_ok(dims, role: str) -> bool:
    """The operand's last two axes are exactly the role's (or size 1), its batch axes carry b then h."""
    if dims is None or len(dims) < 3:
        return False
    want = {"q": ("s", "d"), "k": ("d", "s"), "v": ("s", "d")}[role]
    batch = _labels(dims[:-2])
    return (_labels([dims[-2]]) in ([want[0]], []) and _labels([dims[-1]]) in ([want[1]], [])
            and batch == [x for x in ("b", "h") if x in batch])


@dataclass
class Operand:
    base: relax.Expr  # the tensor the fused op reads (4-D, or 3-D to be viewed as [1, ·, ·, ·])
    layout: str
    bhsd: Tuple[int, int, int, int]
    scale: float = 1.0


def trace_operand(e, var2val, role: str) -> Optional[Operand]:
    """Walk ``e`` back through permute/reshape/scalar-scale ops; the furthest 4-D (then 3-D) tensor that reaches
    ``e`` as ``role`` requires, with its layout, or None."""
    chain = []  # (tensor, op producing it), operand first
    cur = e
    while True:
        val = _value(cur, var2val)
        op = _op(val)
        if op in _SHAPE_OPS:
            chain.append(val)
            cur = val.args[0]
            continue
        if op in ("relax.multiply", "relax.divide") and role != "v":
            so = _scalar_operand(val, var2val)
            if so is not None and _const_scale(val, so[1], var2val) is not None:
                chain.append(val)
                cur = val.args[so[0]]
                continue
        break
    tensors = [e] + [c.args[0] if _op(c) in _SHAPE_OPS else c.args[_scalar_operand(c, var2val)[0]]
                     for c in chain]
    # tensors[i+1] --chain[i]--> tensors[i]
    for ndim in (4, 3):
        for k in range(len(tensors) - 1, -1, -1):
            shape = static_shape(tensors[k])
            if shape is None or len(shape) != ndim:
                continue
            layouts = _LAYOUTS if ndim == 4 else ("HSD",)
            for layout in layouts:
                labels = _LABELS[layout] if ndim == 4 else ("h", "s", "d")
                dims = _atoms(shape, labels)
                scale = 1.0
                for c in reversed(chain[:k]):
                    dims = _apply(dims, c)
                    if dims is None or _merges_head_dim(dims):
                        dims = None  # the walk crossed a hidden state [.., H·D]: that is another computation
                        break
                    if _op(c) in ("relax.multiply", "relax.divide"):
                        scale *= _const_scale(c, c.args[1 - _scalar_operand(c, var2val)[0]], var2val)
                if not _role_ok(dims, role):
                    continue
                if ndim == 4:
                    b, x1, x2, d = shape
                    bhsd = (b, x1, x2, d) if layout == "BHSD" else (b, x2, x1, d)
                    return Operand(tensors[k], layout, bhsd, scale)
                return Operand(tensors[k], "BHSD", (1, *shape), scale)
    return None


def _out_layout(mm_dims, chain) -> Optional[str]:
    """The op output layout from which the root tensor is a reshape, or None."""
    dims = mm_dims
    for i, c in enumerate(chain):
        dims = _apply(dims, c)
        if dims is None or (_merges_head_dim(dims) and i < len(chain) - 1):
            return None  # only the root may be the merged hidden state; past it lies the next computation
    got = _labels(dims)
    for layout in _LAYOUTS:
        if got == [x for x in _LABELS[layout] if x in got]:
            return layout
    return None


# ---------------------------------------------------------------------------------------------------
# the match
# ---------------------------------------------------------------------------------------------------

@dataclass
class _Plan:
    reason: Optional[str] = None
    q: Optional[Operand] = None
    k: Optional[Operand] = None
    v: Optional[Operand] = None
    scale: float = 1.0
    masks: List[Tuple[relax.Expr, float]] = field(default_factory=list)  # (mask, factor it is scaled by)
    causal: bool = False
    out_layout: str = "BHSD"
    guard: bool = False


class _AttentionMatcher:
    """Duck-typed stand-in for a dpl pattern: ``extract_matched_expr`` walks the graph by meaning.

    It returns the Calls that make up scores, probabilities and the output chain (so the engine's leak check
    and claiming cover them) and, under "plan", what the rule needs. Operand chains (head split permutes,
    Q-side scales) are not part of the match: if something else uses them they simply stay.
    """

    def __init__(self, with_out_chain: bool):
        self.with_out_chain = with_out_chain

    def extract_matched_expr(self, expr, var2val) -> Optional[dict]:
        out_chain = []
        cur = expr
        while _op(cur) in _SHAPE_OPS:
            out_chain.append(cur)
            cur = _value(cur.args[0], var2val)
        if bool(out_chain) != self.with_out_chain or _op(cur) != "relax.matmul":
            return None
        mm = cur
        inner = [mm] + out_chain
        p_expr = mm.args[0]
        p = _value(p_expr, var2val)
        inner += _bound(p_expr, var2val)
        guard = False
        if _op(p) == "relax.where" and _op(_value(p.args[0], var2val)) == "relax.isnan":
            isnan = _value(p.args[0], var2val)
            sm = _value(p.args[2], var2val)
            zero = scalar_value(_value(p.args[1], var2val))
            if zero != 0.0 or not _value(isnan.args[0], var2val).same_as(sm):
                return None
            inner += _bound(p.args[0], var2val) + _bound(p.args[2], var2val)
            p, guard = sm, True
        if _op(p) != "relax.nn.softmax":
            return None
        plan = _Plan(guard=guard)
        scores = _walk_scores(p.args[0], var2val, plan, inner)
        if scores is None:
            return None  # no q·kᵀ under the softmax: not attention
        qk = scores
        matched = {"mm": mm, "plan": plan}
        matched.update({f"_inner{i}": c for i, c in enumerate(inner)})
        plan.reason = plan.reason or _analyse(plan, p, qk, mm, out_chain, var2val)
        if plan.reason is not None and out_chain:
            return None  # refuse once, at the matmul itself, not at every binding of the head merge
        for i, (m, _) in enumerate(plan.masks):
            matched[f"mask{i}"] = m
        for name in ("q", "k", "v"):
            op = getattr(plan, name)
            if op is not None:
                matched[name] = op.base
        return matched


def _leads_to_matmul(e, var2val, depth=0) -> bool:
    v = _value(e, var2val)
    op = _op(v)
    if op == "relax.matmul":
        return True
    if depth < 8 and op in ("relax.add", "relax.multiply", "relax.divide"):
        return any(_leads_to_matmul(a, var2val, depth + 1) for a in v.args)
    return False


def _walk_scores(x, var2val, plan: _Plan, inner: list) -> Optional[relax.Call]:
    """From the softmax input down to q·kᵀ, collecting scales and masks; None if there is no q·kᵀ."""
    factor = 1.0
    cur = x
    while True:
        inner.extend(_bound(cur, var2val))
        val = _value(cur, var2val)
        op = _op(val)
        if op == "relax.matmul":
            plan.scale *= factor
            return val
        if op == "relax.add":
            a, b = val.args
            if _leads_to_matmul(a, var2val):
                cur, mask = a, b
            elif _leads_to_matmul(b, var2val):
                cur, mask = b, a
            else:
                return None
            plan.masks.append((mask, factor))
            continue
        if op in ("relax.multiply", "relax.divide"):
            so = _scalar_operand(val, var2val)
            if so is None:
                idx = next((i for i in (0, 1) if _leads_to_matmul(val.args[i], var2val)), None)
                if idx is None:
                    return None
                plan.reason = plan.reason or "scores are multiplied by a tensor, not a scalar scale"
                cur = val.args[idx]
                continue
            c = _const_scale(val, so[1], var2val)
            if c is None:
                plan.reason = plan.reason or "scale is not a scalar constant"
                c = 1.0
            factor *= c
            cur = val.args[so[0]]
            continue
        return None


def _analyse(plan: _Plan, sm, qk, mm, out_chain, var2val) -> Optional[str]:
    scores_shape = static_shape(qk)
    if scores_shape is None or static_shape(mm) is None:
        return "shapes are not static"
    axis = int(sm.attrs.axis)
    if axis not in (-1, len(scores_shape) - 1):
        return f"softmax is over axis {axis}, not the key axis (last)"
    if len(scores_shape) not in (3, 4):
        return f"scores have rank {len(scores_shape)} (expected 3 or 4)"
    for mmc in (qk, mm):
        out_dtype = str(mmc.attrs.out_dtype or "")
        if out_dtype not in ("", "void", "None", str(mmc.args[0].ty.dtype)):
            return f"a matmul changes dtype to {out_dtype}"
    plan.q = trace_operand(qk.args[0], var2val, "q")
    plan.k = trace_operand(qk.args[1], var2val, "k")
    plan.v = trace_operand(mm.args[1], var2val, "v")
    for name in ("q", "k", "v"):
        if getattr(plan, name) is None:
            return f"{name} is not a head-split view of a [B,S,H,D] / [B,H,S,D] tensor"
    (bq, hq, s, dq), (bk, hk, t, dk), (bv, hv, tv, dv) = plan.q.bhsd, plan.k.bhsd, plan.v.bhsd
    if dq != dk:
        return f"q head dim {dq} differs from k head dim {dk}"
    if t != tv:
        return f"k has {t} keys, v has {tv}"
    if dv != dq:
        return f"v head dim {dv} differs from q/k head dim {dq}"
    if (bq, hq) != (bk, hk) or (bq, hq) != (bv, hv):
        return f"batch/heads differ: q {(bq, hq)}, k {(bk, hk)}, v {(bv, hv)}"
    if scores_shape[-2:] != [s, t] or _numel(scores_shape) != bq * hq * s * t:
        return f"scores shape {scores_shape} is not (B, H, S, T) = {(bq, hq, s, t)} (broadcast batch dims)"
    dtypes = {str(o.base.ty.dtype) for o in (plan.q, plan.k, plan.v)}
    if len(dtypes) != 1:
        return f"q/k/v dtypes differ: {sorted(dtypes)}"
    plan.scale *= plan.q.scale * plan.k.scale
    if not math.isfinite(plan.scale):
        return "scale is not finite"
    reason = _analyse_masks(plan, scores_shape, (bq, hq, s, t), str(qk.ty.dtype), var2val)
    if reason:
        return reason
    # output: the matmul's axes, then whatever permute/reshape the graph applied after it
    scores_dims = _atoms_of_scores(scores_shape, (bq, hq, s, t))
    if scores_dims is None:
        return f"scores shape {scores_shape} does not group (B, H, S, T) = {(bq, hq, s, t)}"
    mm_dims = scores_dims[:-1] + [[("d", dq)] if dq != 1 else []]
    layout = _out_layout(mm_dims, list(reversed(out_chain)))
    if layout is None:
        return "the permutes after the attention are not a head merge"
    plan.out_layout = layout
    return None


def _atoms_of_scores(shape, bhst):
    """The scores' axes in atoms; matmul batch axes are the operands' (b then h), however they are grouped."""
    dims = _atoms(bhst, ("b", "h", "s", "t"))
    return _regroup(dims, shape)


def _analyse_masks(plan: _Plan, scores_shape, bhst, dtype, var2val) -> Optional[str]:
    b, h, s, t = bhst
    kept = []
    for mask, factor in plan.masks:
        ms = static_shape(mask)
        if ms is None:
            return "mask shape is not static"
        if str(mask.ty.dtype) != dtype:
            return f"mask is not additive (dtype {mask.ty.dtype}, scores {dtype})"
        if len(ms) > len(scores_shape) or len(ms) > 4:
            return f"mask of rank {len(ms)} does not broadcast to (B, H, S, T)"
        # right-aligned: graph broadcasting against the scores and the op's against (B, H, S, T) must agree
        op_shape = (b, h, s, t)
        for i in range(1, len(ms) + 1):
            m_i, g_i, o_i = ms[-i], scores_shape[-i], op_shape[-i]
            if m_i != 1 and (m_i != g_i or m_i != o_i):
                return f"mask of shape {ms} does not broadcast to (B, H, S, T) = {op_shape}"
        value = _const_eval(mask, var2val)
        if value is not None and factor > 0 and is_causal_mask(value * factor if factor != 1 else value, s, t):
            plan.causal = True
            continue
        kept.append((mask, factor))
    if len(kept) > _MAX_MASKS:
        return f"{len(kept)} additive masks (at most {_MAX_MASKS} are read)"
    plan.masks = kept
    return None


# ---------------------------------------------------------------------------------------------------
# the rule
# ---------------------------------------------------------------------------------------------------

class MultiHeadAttentionRule(FusionRule):
    name = "FuseMultiHeadAttention"
    kind = "attention"

    def variants(self) -> List[Variant]:
        # the head-merge chain first: the engine visits its last binding before the matmul it starts from
        return [Variant(_AttentionMatcher(True), _NAMES, {"out_chain": True}),
                Variant(_AttentionMatcher(False), _NAMES, {"out_chain": False}, "relax.matmul")]

    def check(self, m: Match) -> Optional[str]:
        return m["plan"].reason

    def describe(self, m: Match) -> str:
        p: _Plan = m["plan"]
        parts = [f"q {p.q.layout}", f"k {p.k.layout}", f"v {p.v.layout}", f"out {p.out_layout}",
                 f"scale {p.scale:.6g}"]
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
            if len(static_shape(op.base)) == 3:
                x = bb.emit(relax.op.reshape(x, op.bhsd))
            inputs[name] = x
        mask = None
        for i, (_, factor) in enumerate(p.masks):
            # the op broadcasts its mask: pass it at the size it varies over (no S×T tensor left)
            mi = compact_mask(m[f"mask{i}"], m._var2val, m.arg_remap, bb)
            if factor != 1.0:
                mi = bb.emit(relax.op.multiply(mi, relax.const(factor, str(mi.ty.dtype))))
            mask = mi if mask is None else bb.emit(relax.op.add(mask, mi))
        inputs["mask"] = mask
        params = {"scale": float(p.scale), "causal": bool(p.causal), "q_layout": p.q.layout,
                  "k_layout": p.k.layout, "v_layout": p.v.layout, "out_layout": p.out_layout}
        out = call_op(bb, "fused_attention", inputs, params)
        root_shape = static_shape(m.root_var)
        out_shape = _op_out_shape(p)
        if out_shape != root_shape:
            out = relax.op.reshape(bb.emit(out, name_hint="attn"), root_shape)
        return out


def _op_out_shape(p: _Plan) -> List[int]:
    b, h, s, _ = p.q.bhsd
    d = p.v.bhsd[3]
    return [b, h, s, d] if p.out_layout == "BHSD" else [b, s, h, d]


_MAX_MASKS = 4
_NAMES = {n: n for n in ("mm", "plan", "q", "k", "v", *(f"mask{i}" for i in range(_MAX_MASKS)))}


def FuseMultiHeadAttention() -> tvm.transform.Pass:  # noqa: N802  (TVM pass naming)
    return rule_pass("tfx.FuseMultiHeadAttention", [MultiHeadAttentionRule()])
