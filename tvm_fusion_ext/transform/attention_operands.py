"""From an attention matmul operand back to the tensor ``fused_attention`` reads, and in which layout.

Exporters split heads with reshape/permute chains (and SDPA scales q and k by scalars on the way); the fused
operator reads the tensor before the chain, in layout BSHD or BHSD. Each axis is tracked as *atoms*
(label, size) through the chain: a reshape regroups atoms, a permute reorders axes, size-1 axes carry none
(they move freely). A walk succeeds at the furthest tensor whose atoms reach the operand as the role needs
(q: (B, H | S, D), k: (B, H | D, T), v: (B, H | T, D)) without passing through a hidden state (an axis
merging the head dim with another, ``[B, S, H·D]``), where another computation begins.

A 3-D tensor ``[B·H, S, D]`` is read two ways: with B and H as the operand's own ``[B, H, ·, ·]`` view splits
them (torch's ``nn.MultiheadAttention`` splits heads on 3-D tensors and views them 4-D only for the matmuls), or,
where the matmuls are 3-D themselves (BLOOM), as batch 1 with B·H heads. A seq-first ``[S, B·H, D]`` (the same
module's 3-D matmuls when it returns its attention weights; WavLM) is read as batch 1 in BSHD. The operator reads
each reshaped to 4-D, a free view. With B symbolic (a dynamic batch) B·H heads would be symbolic, and the
operator needs static heads: such a tensor is read as B·H batches of one head instead, the seq-first one
transposed first.

Grouped-query attention: K/V heads repeated for the query heads (``expand_dims → broadcast_to → reshape``,
``repeat`` along the heads axis, ``tile``) add a *group* atom ``("g", n)``. Heads read as ``(h, g)``, K/V head
``h`` serving query heads ``h·n … h·n + n-1`` (``repeat_kv``, ``repeat_interleave``), are what the operator
reads in place; ``(g, h)`` (a tile: query head ``i`` reads K/V head ``i mod Hkv``) is refused with that reason.

Rotary embeddings: a ``fused_rope`` call on the way (``transform/rope.py`` made it) is walked through when
its own axis names (positions, head dim, heads) are the attention axes there; the operand then records the
rotation, and the fused attention rotates Q or K where it reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

import tvm
from tvm import relax

from ..ops.registry import op_of, params_of
from .graph import (FunctionGraph, dims_product, int_list, numel, op_name, same_dim, same_dims, scalar_value,
                    shape_dims, static_shape)

SHAPE_OPS = ("relax.permute_dims", "relax.reshape")
#: views and head repeats an operand may pass through on its way from the tensor the fused op reads
WALK_OPS = SHAPE_OPS + ("relax.expand_dims", "relax.squeeze", "relax.broadcast_to", "relax.repeat", "relax.tile")
SCALE_OPS = ("relax.multiply", "relax.divide")
LAYOUTS = ("BHSD", "BSHD")
_LABELS = {"BHSD": ("b", "h", "s", "d"), "BSHD": ("b", "s", "h", "d"),
           # K already transposed per head, [B, H, D, T]: SqueezeBERT's keys, split from channel-first [B, H·D, T]
           # and multiplied as they are. The operator reads it through a transposed copy (BHSD)
           "BHDS": ("b", "h", "d", "s")}


# ---------------------------------------------------------------------------------------------------
# scalar scales
# ---------------------------------------------------------------------------------------------------

def scalar_operand(call: relax.Call) -> Optional[Tuple[int, relax.Expr]]:
    """For a multiply/divide that keeps its tensor operand's shape: (index of the tensor operand, the other)."""
    shape_out = shape_dims(call)
    for i in (0, 1):
        other = call.args[1 - i]
        if same_dims(shape_dims(call.args[i]), shape_out) and numel(static_shape(other)) == 1:
            if op_name(call) == "relax.divide" and i == 1:
                continue  # c / x is not a scale of x
            return i, other
    return None


def const_scale(call: relax.Call, other: relax.Expr, graph: FunctionGraph) -> Optional[float]:
    """The factor a scalar multiply/divide applies (``/ c`` is ``· 1/c``), when ``other`` is a constant."""
    c = scalar_value(graph.value(other))
    if c is None:
        return None
    if op_name(call) == "relax.divide":
        return None if c == 0 else 1.0 / c
    return c


# ---------------------------------------------------------------------------------------------------
# atoms
# ---------------------------------------------------------------------------------------------------

def atoms(shape, labels):
    """One list of (label, size) per axis; size-1 axes carry no atom (they can move freely). A size is an
    ``int`` or a symbolic dim (a symbolic one is never taken for 1)."""
    return [[(lab, n)] if not _is_one(n) else [] for lab, n in zip(labels, shape)]


def _is_one(n) -> bool:
    return isinstance(n, int) and n == 1


def _apply(dims, call):
    op = op_name(call)
    if op == "relax.permute_dims":
        axes = int_list(call.attrs.axes)
        axes = list(reversed(range(len(dims)))) if axes is None else [a % len(dims) for a in axes]
        return [dims[a] for a in axes]
    if op in ("relax.reshape", "relax.expand_dims", "relax.squeeze"):
        return regroup(dims, shape_dims(call))
    if op == "relax.broadcast_to":
        out = shape_dims(call)
        if out is None or len(out) < len(dims):
            return None
        padded = [[]] * (len(out) - len(dims)) + list(dims)
        # an axis the broadcast grows from 1 repeats the whole tensor along it: a group atom (static: heads)
        grown = []
        for d, n in zip(padded, out):
            if same_dim(_size(d), n):
                grown.append(d)
            elif _is_one(_size(d)) and isinstance(n, int):
                grown.append([("g", n)])
            else:
                return None
        return grown
    if op == "relax.repeat":  # repeat_interleave: element i of the axis becomes i·n … i·n + n-1
        axis, n = call.attrs.axis, int(call.attrs.repeats)
        if axis is None:
            return None
        axis = int(axis) % len(dims)
        return [d + [("g", n)] if i == axis and n > 1 else d for i, d in enumerate(dims)]
    if op == "relax.tile":  # the whole axis n times: the copy index is the major part
        reps = [int(r) for r in call.attrs.repeats]
        if len(reps) != len(dims):
            return None
        return [([("g", r)] if r > 1 else []) + d for d, r in zip(dims, reps)]
    if op == "relax.call_tir":
        return dims  # a fused_rope on the way: elementwise (its axes are checked by the walk)
    return dims  # scalar scale


def _size(dim):
    return dims_product([k for _, k in dim])


def regroup(dims, shape):
    """The atoms of ``dims`` after a reshape to ``shape``; None if the reshape splits an atom.

    Each output axis takes atoms in order until their product is the axis size (provably, for symbolic
    sizes: ``batch · seq`` is the atoms batch, seq); static sizes that overshoot split an atom."""
    if shape is None:
        return None
    flat = [a for d in dims for a in d]
    out, i = [], 0
    for n in shape:
        grp = []
        while not same_dim(_size(grp), n):
            p = _size(grp)
            if i == len(flat) or (isinstance(p, int) and isinstance(n, int) and p > n):
                return None  # an axis would be split: not a view of whole heads/tokens
            grp.append(flat[i])
            i += 1
        out.append(grp)
    return out if i == len(flat) else None


def _merges_head_dim(dims) -> bool:
    """An axis holds the head dim together with another one: a hidden state, not a per-head view."""
    return any(len(d) > 1 and any(a[0] == "d" for a in d) for d in dims)


def _labels(dims) -> List[str]:
    return [a[0] for d in dims for a in d]


def _role_ok(dims, role: str) -> bool:
    """The operand's last two axes are exactly the role's (or size 1), its batch axes carry b then h, then
    (K and V only) the group atoms of repeated heads."""
    if dims is None or len(dims) < 3:
        return False
    want = {"q": ("s", "d"), "k": ("d", "s"), "v": ("s", "d")}[role]
    batch = _labels(dims[:-2])
    order = ("b", "h", "g") if role != "q" else ("b", "h")
    if len([x for x in batch if x == "g"]) > 1 or len(set(batch)) != len(batch):
        return False
    return (_labels([dims[-2]]) in ([want[0]], []) and _labels([dims[-1]]) in ([want[1]], [])
            and batch == [x for x in order if x in batch])


def _tiled_heads(dims, role: str) -> bool:
    """The heads are repeated in tile order (group atom before the K/V head atom)."""
    if dims is None or len(dims) < 3 or role == "q":
        return False
    batch = _labels(dims[:-2])
    return "g" in batch and "h" in batch and batch.index("g") < batch.index("h")


def _group(dims) -> int:
    return _size([a for d in dims for a in d if a[0] == "g"])


# ---------------------------------------------------------------------------------------------------
# operands and output
# ---------------------------------------------------------------------------------------------------

@dataclass
class Rotary:
    """A ``fused_rope`` the operand was read through: the fused attention applies it where it reads."""

    style: str
    cos: relax.Expr
    sin: relax.Expr


@dataclass
class Operand:
    base: relax.Expr  # the tensor the fused op reads (4-D, or 3-D [B·H, S, D] to be viewed as bhsd)
    layout: str
    bhsd: Tuple  # (B, heads of the base, S, D): K/V heads for a grouped operand; B and S may be symbolic
    scale: float = 1.0
    group: int = 1  # query heads per head of the base (grouped-query attention)
    rope: Optional[Rotary] = None
    #: the base is seq-first ``[S, B·H, D]`` with B·H symbolic: read as B·H batches of one head once transposed to
    #: ``[B·H, S, D]`` (a copy, which the graph's own transpose made too)
    seq_first: bool = False
    #: the base is K transposed, ``[B, H, D, T]``: the operator reads ``permute_dims(base, [0, 1, 3, 2])`` (BHSD)
    transposed: bool = False


def _rope_call(val, graph: FunctionGraph):
    """The params of a ``fused_rope`` call_tir, else None."""
    if op_name(val) != "relax.call_tir" or not isinstance(val.args[0], relax.GlobalVar):
        return None
    func = graph.callee(val.args[0])
    if not isinstance(func, tvm.tirx.PrimFunc) or op_of(func) != "fused_rope":
        return None
    return params_of(func)


def _rope_axes_ok(dims, layout: str) -> bool:
    """At a rotation, the walk's atoms name the axes as the rotation does (size-1 axes carry none)."""
    if dims is None or len(dims) != 4:
        return False
    names = _LABELS[layout]
    for axis, atoms_ in zip(names, dims):
        labels = [a[0] for a in atoms_]
        if axis == "h":
            if any(x not in ("h",) for x in labels):
                return False
        elif labels not in ([], [axis]):
            return False
    return True


def operand_candidates(e: relax.Expr, graph: FunctionGraph, role: str,
                       why: Optional[list] = None) -> Iterator[Operand]:
    """Walk ``e`` back through views, head repeats, scalar scales and rotations: every tensor that reaches ``e``
    as ``role`` requires, with its layout, furthest first, 4-D before 3-D (``why`` collects a reason when a
    candidate was close: heads repeated in tile order). Size-1 axes carry no meaning of their
    own, so a far tensor can read consistently yet wrongly: Falcon's V, ``[1 (its one head), B, S, D]`` sliced
    from the heads-first QKV view and permuted to ``[B, 1, S, D]``, also reads as B = 1 with B heads. The
    caller picks the first reading that agrees with the other operands."""
    chain = []  # ops from the operand back towards its source
    tensors = [e]  # tensors[i+1] --chain[i]--> tensors[i]
    cur = e
    while True:
        val = graph.value(cur)
        op = op_name(val)
        if op in WALK_OPS:
            cur = val.args[0]
        elif _rope_call(val, graph) is not None and role != "v":
            cur = val.args[1].fields[0]
        elif op in SCALE_OPS and role != "v":
            so = scalar_operand(val)
            if so is None or const_scale(val, so[1], graph) is None:
                break
            cur = val.args[so[0]]
        else:
            break
        chain.append(val)
        tensors.append(cur)
    heads_of_e = _batch_heads(e)
    transposed: List[Operand] = []  # readings that need a transposed copy: after every other one
    for ndim in (4, 3):
        for k in range(len(tensors) - 1, -1, -1):
            shape = shape_dims(tensors[k])
            if shape is None or len(shape) != ndim:
                continue
            if ndim == 3:
                layouts = ("B.HSD", "HSD", "SHD")
            else:  # Kᵀ may also be read as already transposed per head (through a copy: tried last)
                layouts = (*LAYOUTS, "BHDS") if role == "k" else LAYOUTS
            for layout in layouts:
                if layout == "B.HSD":
                    # a [B·H, S, D] tensor that the operand's own [B, H, ..] view splits (torch's
                    # nn.MultiheadAttention: heads split on 3-D tensors, viewed as 4-D for the matmuls)
                    if heads_of_e is None or not same_dim(shape[0], dims_product(list(heads_of_e))):
                        continue
                    dims = [[a for a in (("b", heads_of_e[0]), ("h", heads_of_e[1])) if not _is_one(a[1])]] \
                        + atoms(shape[1:], ("s", "d"))
                else:
                    dims = atoms(shape, _LABELS[layout] if ndim == 4 else tuple(layout.lower()))
                scale, rope = 1.0, None
                for c in reversed(chain[:k]):
                    rope_params = _rope_call(c, graph)
                    if rope_params is not None:
                        if rope is not None or not _rope_axes_ok(dims, rope_params.get("layout", "BHSD")):
                            dims = None  # a rotation along other axes than the attention's: not read through
                            break
                        rope = Rotary(rope_params["style"], c.args[1].fields[1], c.args[1].fields[2])
                    dims = _apply(dims, c)
                    if dims is None or _merges_head_dim(dims):
                        dims = None  # the walk crossed a hidden state [.., H·D]: that is another computation
                        break
                    if op_name(c) in SCALE_OPS:
                        scale *= const_scale(c, c.args[1 - scalar_operand(c)[0]], graph)
                if not _role_ok(dims, role):
                    if why is not None and _tiled_heads(dims, role):
                        why.append(f"{role} heads are repeated as a tile (query head i reads K/V head i mod Hkv), "
                                   "not grouped")
                    continue
                group = _group(dims)
                if ndim == 4 and layout == "BHDS":
                    if rope is None:  # a rotation is read where the operator reads K, in BSHD/BHSD only
                        b, h, d, t = shape
                        transposed.append(Operand(tensors[k], "BHSD", (b, h, t, d), scale, group, transposed=True))
                    continue
                if ndim == 4:
                    b, x1, x2, d = shape
                    bhsd = (b, x1, x2, d) if layout == "BHSD" else (b, x2, x1, d)
                    yield Operand(tensors[k], layout, bhsd, scale, group, rope)
                    continue
                if group != 1 or rope is not None:
                    continue  # a 3-D [B·H, S, D] base: no room for grouped heads
                if layout == "SHD":  # seq-first [S, B·H, D] (nn.MultiheadAttention's 3-D matmuls): [1, S, B·H, D]
                    if isinstance(shape[1], int):
                        yield Operand(tensors[k], "BSHD", (1, shape[1], shape[0], shape[2]), scale)
                    else:  # a dynamic batch: B·H batches of one head, the operator's heads static
                        yield Operand(tensors[k], "BHSD", (shape[1], 1, shape[0], shape[2]), scale, seq_first=True)
                    continue
                if layout == "B.HSD":
                    bhsd = (*heads_of_e, *shape[1:])
                elif isinstance(shape[0], int):
                    bhsd = (1, *shape)
                else:  # B·H symbolic (a dynamic batch): read as B·H batches of one head, the operator's heads static
                    bhsd = (shape[0], 1, *shape[1:])
                yield Operand(tensors[k], "BHSD", bhsd, scale)
    yield from transposed


def _batch_heads(e: relax.Expr) -> Optional[Tuple]:
    """(B, H) of a 4-D matmul operand ``[B, H, ·, ·]``, else None."""
    shape = shape_dims(e)
    return (shape[0], shape[1]) if shape is not None and len(shape) == 4 else None


def out_layout(mm_dims, chain) -> Optional[str]:
    """The op output layout from which the root tensor is a reshape, or None."""
    dims = mm_dims
    while chain and op_name(chain[-1]) == "relax.reshape":
        # a reshape of the op's contiguous output is that reshape whatever it groups: only the permutes before
        # it need reading (a seq-first merge, ``[S, B·H, D] -> [S·B, H·D]``, splits the B·H the matmuls saw)
        chain = chain[:-1]
    for i, c in enumerate(chain):
        dims = _apply(dims, c)
        if dims is None or (_merges_head_dim(dims) and i < len(chain) - 1):
            return None  # only the root may be the merged hidden state; past it lies the next computation
    got = _labels(dims)
    for layout in LAYOUTS:
        if got == [x for x in _LABELS[layout] if x in got]:
            return layout
    return None
