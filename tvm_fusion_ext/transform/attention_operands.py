"""From an attention matmul operand back to the tensor ``fused_attention`` reads, and in which layout.

Exporters split heads with reshape/permute chains (and SDPA scales q and k by scalars on the way); the fused
operator reads the tensor before the chain, in layout BSHD or BHSD. Each axis is tracked as *atoms*
(label, size) through the chain: a reshape regroups atoms, a permute reorders axes, size-1 axes carry none
(they move freely). A walk succeeds at the furthest tensor whose atoms reach the operand as the role needs
(q: (B, H | S, D), k: (B, H | D, T), v: (B, H | T, D)) without passing through a hidden state (an axis
merging the head dim with another, ``[B, S, H·D]``), where another computation begins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from tvm import relax

from .graph import FunctionGraph, int_list, numel, op_name, scalar_value, static_shape

SHAPE_OPS = ("relax.permute_dims", "relax.reshape")
SCALE_OPS = ("relax.multiply", "relax.divide")
LAYOUTS = ("BHSD", "BSHD")
_LABELS = {"BHSD": ("b", "h", "s", "d"), "BSHD": ("b", "s", "h", "d")}


# ---------------------------------------------------------------------------------------------------
# scalar scales
# ---------------------------------------------------------------------------------------------------

def scalar_operand(call: relax.Call) -> Optional[Tuple[int, relax.Expr]]:
    """For a multiply/divide that keeps its tensor operand's shape: (index of the tensor operand, the other)."""
    shape_out = static_shape(call)
    for i in (0, 1):
        other = call.args[1 - i]
        if static_shape(call.args[i]) == shape_out and numel(static_shape(other)) == 1:
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
    """One list of (label, size) per axis; size-1 axes carry no atom (they can move freely)."""
    return [[(lab, n)] if n != 1 else [] for lab, n in zip(labels, shape)]


def _apply(dims, call):
    op = op_name(call)
    if op == "relax.permute_dims":
        axes = int_list(call.attrs.axes)
        axes = list(reversed(range(len(dims)))) if axes is None else [a % len(dims) for a in axes]
        return [dims[a] for a in axes]
    if op == "relax.reshape":
        return regroup(dims, static_shape(call))
    return dims  # scalar scale


def regroup(dims, shape):
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


# ---------------------------------------------------------------------------------------------------
# operands and output
# ---------------------------------------------------------------------------------------------------

@dataclass
class Operand:
    base: relax.Expr  # the tensor the fused op reads (4-D, or 3-D to be viewed as [1, ·, ·, ·])
    layout: str
    bhsd: Tuple[int, int, int, int]
    scale: float = 1.0


def trace_operand(e: relax.Expr, graph: FunctionGraph, role: str) -> Optional[Operand]:
    """Walk ``e`` back through permute/reshape/scalar-scale ops; the furthest 4-D (then 3-D) tensor that reaches
    ``e`` as ``role`` requires, with its layout, or None."""
    chain = []  # ops from the operand back towards its source
    tensors = [e]  # tensors[i+1] --chain[i]--> tensors[i]
    cur = e
    while True:
        val = graph.value(cur)
        op = op_name(val)
        if op in SHAPE_OPS:
            cur = val.args[0]
        elif op in SCALE_OPS and role != "v":
            so = scalar_operand(val)
            if so is None or const_scale(val, so[1], graph) is None:
                break
            cur = val.args[so[0]]
        else:
            break
        chain.append(val)
        tensors.append(cur)
    for ndim in (4, 3):
        for k in range(len(tensors) - 1, -1, -1):
            shape = static_shape(tensors[k])
            if shape is None or len(shape) != ndim:
                continue
            for layout in (LAYOUTS if ndim == 4 else ("HSD",)):
                labels = _LABELS[layout] if ndim == 4 else ("h", "s", "d")
                dims = atoms(shape, labels)
                scale = 1.0
                for c in reversed(chain[:k]):
                    dims = _apply(dims, c)
                    if dims is None or _merges_head_dim(dims):
                        dims = None  # the walk crossed a hidden state [.., H·D]: that is another computation
                        break
                    if op_name(c) in SCALE_OPS:
                        scale *= const_scale(c, c.args[1 - scalar_operand(c)[0]], graph)
                if not _role_ok(dims, role):
                    continue
                if ndim == 4:
                    b, x1, x2, d = shape
                    bhsd = (b, x1, x2, d) if layout == "BHSD" else (b, x2, x1, d)
                    return Operand(tensors[k], layout, bhsd, scale)
                return Operand(tensors[k], "BHSD", (1, *shape), scale)
    return None


def out_layout(mm_dims, chain) -> Optional[str]:
    """The op output layout from which the root tensor is a reshape, or None."""
    dims = mm_dims
    for i, c in enumerate(chain):
        dims = _apply(dims, c)
        if dims is None or (_merges_head_dim(dims) and i < len(chain) - 1):
            return None  # only the root may be the merged hidden state; past it lies the next computation
    got = _labels(dims)
    for layout in LAYOUTS:
        if got == [x for x in _LABELS[layout] if x in got]:
            return layout
    return None
