"""Kernel signatures, and the per-kernel knob table that carries tuned knobs to kernels no record matches.

A tuning record names one PrimFunc exactly (MetaSchedule matches workloads by structure), so it never reaches a
kernel whose rows are known only at run time. The knobs in a template-space record mostly do not depend on the
rows: a K split, the unroll step, the register tile's row count. A **signature** is what such knobs depend on:
the operator, its parameters without the row-only ones, its inputs' dtypes and their dims that are not row dims
(N, K, heads, head dim, the key block). A static kernel tuned at a representative size and the symbolic kernel of
the same layer get the same signature; another weight shape, activation or dtype gets another one.

The signature is computed from a lowered PrimFunc (at schedule time) and from an operator call (at prepare time,
before lowering) by one function over ``(op, params, {input: (dtype, shape)})``, so the two always agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import tvm

#: parameters that only say how run-time rows are padded: a static kernel has none of them
ROW_ONLY_PARAMS = ("row_block", "row_clamp", "query_block")

#: per operator: which axes of which input are row axes (batch, sequence), by input name. ``"leading"``: every
#: axis but the last; ``"all"``: every axis (a mask, per-token bookkeeping). Inputs not listed have no row axis
#: (weights, biases, LayerNorm scales). An operator not listed has no signature: it takes no transferred knobs.
_ROW_AXES = {
    "fused_dense": {"x": "leading"},
    "fused_gated_dense": {"x": "leading"},
    "fused_layernorm": {"x": "leading", "residual": "leading"},
    "fused_rmsnorm": {"x": "leading", "residual": "leading"},
    "fused_attention": {"mask": "all", "q_cos": "leading", "q_sin": "leading", "k_cos": "leading",
                        "k_sin": "leading", "cu_seqlens": "all", "row_seq": "all", "key_bias": "all"},
}
#: attention's q/k/v: batch and sequence are row axes, heads and head dim are not (axes by layout)
_BSHD_ROWS = {"BSHD": (0, 1), "BHSD": (0, 2)}


def _dim(d):
    return int(d) if isinstance(d, (int, tvm.tirx.IntImm)) else None


def _row_axes(op: str, params: dict, name: str, rank: int) -> Sequence[int]:
    if op == "fused_attention" and name in ("q", "k", "v"):
        return _BSHD_ROWS.get(params.get(f"{name}_layout", "BSHD"), ())
    kind = _ROW_AXES.get(op, {}).get(name)
    if kind == "leading":
        return range(rank - 1)
    if kind == "all":
        return range(rank)
    return ()


def _attention_key_block(params: dict, inputs: Dict[str, Tuple[str, list]]) -> int:
    """The key block the operator will use (its parameter, else its default for the key count)."""
    from ..ops.attention import SYMBOLIC_KEY_BLOCK, default_key_block

    if params.get("key_block"):
        return int(params["key_block"])
    shape = inputs["k"][1]
    keys = (inputs["mask"][1][-1] if params.get("preallocated_kv")  # K is a cache longer than its keys
            else shape[1 if params.get("k_layout", "BSHD") == "BSHD" else 2])
    return default_key_block(keys) if keys is not None else SYMBOLIC_KEY_BLOCK


def _contributed_heads(params: dict, inputs: Dict[str, Tuple[str, list]]) -> Dict[str, Tuple[str, list]]:
    """Attention's q/k/v with their head axis cut to the heads the kernel reads. A kernel reading heads [12, 24)
    of a 36-head tensor (one projection output read in place) has the loops, hence the knobs, of one reading a
    12-head tensor, so records tuned before heads were read in place still reach it."""
    from ..ops.attention import head_axis, head_ranges

    axes = {n: head_axis(params.get(f"{n}_layout", "BSHD")) for n in "qkv"}
    extents = {n: inputs[n][1][axes[n]] for n in "qkv"}
    out = dict(inputs)
    for name, (_, count) in head_ranges(params, extents).items():
        dtype, dims = out[name]
        out[name] = (dtype, [count if i == axes[name] else d for i, d in enumerate(dims)])
    return out


def signature(op: str, params: dict, inputs: Dict[str, Tuple[str, list]]) -> Optional[str]:
    """The signature of operator ``op`` with ``params`` on ``inputs`` (``{name: (dtype, dims)}``, a dim an
    ``int`` or None when symbolic); None for an operator without a row-axis table (it never takes transferred
    knobs), or when a dim outside the row axes is symbolic (nothing static to match on)."""
    if op not in _ROW_AXES:
        return None
    kept = {k: v for k, v in sorted(params.items()) if k not in ROW_ONLY_PARAMS}
    if op == "fused_attention":
        kept["key_block"] = _attention_key_block(params, inputs)
        inputs = _contributed_heads(params, inputs)
        from ..ops.attention import HEAD_RANGE_PARAMS

        kept = {k: v for k, v in kept.items() if k not in HEAD_RANGE_PARAMS}
    shapes = {}
    for name, (dtype, dims) in sorted(inputs.items()):
        rows = set(_row_axes(op, params, name, len(dims)))
        static = [d for i, d in enumerate(dims) if i not in rows]
        if any(d is None for d in static):
            return None
        # row axes collapse into one "*": a [batch, seq, K] kernel and a [rows, K] one share their knobs
        text = (["*"] if rows else []) + [str(d) for d in static]
        shapes[name] = f"{dtype}[{','.join(text)}]"
    return f"{op}({json.dumps(kept, sort_keys=True)}; {', '.join(f'{k}: {v}' for k, v in shapes.items())})"


#: attribute of a short-request copy of a kernel (compile/variants/branches.py): the signature of the kernel it copies
VARIANT_OF = "tfx.variant_of"


def kernel_signature(func) -> Optional[str]:
    """The signature of a lowered fused-operator PrimFunc (``tfx.op`` / ``tfx.params`` / ``tfx.inputs``)."""
    from ..ops.registry import inputs_of, op_of, params_of

    if not isinstance(func, tvm.tirx.PrimFunc) or op_of(func) is None:
        return None
    # 0.27: a PrimFunc parameter's type is its buffer; inputs come first, in tfx.inputs order
    inputs = {name: (str(p.ty.dtype), [_dim(d) for d in p.ty.shape])
              for name, p in zip(inputs_of(func), func.params)}
    return signature(op_of(func), params_of(func), inputs)


def call_signature(call) -> Optional[str]:
    """The signature of an :class:`~tvm_fusion_ext.ops.OperatorCall` (as the operator will be lowered)."""
    inputs = {name: (str(expr.ty.dtype), [_dim(d) for d in expr.ty.shape.values])
              for name, expr in call.inputs.items() if expr is not None}
    return signature(call.op, call.params, inputs)


# ----------------------------------------------------------------------------------------------- the table

@dataclass(frozen=True)
class TransferredKnobs:
    """Knobs of one tuned kernel, as its template's symbolic path reads them."""

    rule: str                  # the block rule ("tfx.dense")
    signature: str
    knobs: dict                # knob name -> decision, only knobs whose meaning does not depend on the rows
    source: str                # the record directory they come from

    def to_dict(self) -> dict:
        return {"rule": self.rule, "signature": self.signature, "knobs": dict(self.knobs), "from": self.source}


@dataclass
class KernelKnobs:
    """Signature → transferred knobs, and which of them a compilation used (for the manifest)."""

    by_signature: Dict[str, TransferredKnobs] = field(default_factory=dict)
    #: kernels scheduled with transferred knobs, per signature, in first-use order
    scheduled: Dict[str, int] = field(default_factory=dict)

    def add(self, entry: TransferredKnobs) -> bool:
        """Keep the first entry per signature (sources are offered in a deterministic order); False if taken."""
        if entry.signature in self.by_signature:
            return False
        self.by_signature[entry.signature] = entry
        return True

    def lookup(self, rule: str, sig: Optional[str]) -> Optional[dict]:
        """The knobs for a kernel of ``rule`` with signature ``sig``, or None."""
        entry = self.by_signature.get(sig) if sig is not None else None
        if entry is None or entry.rule != rule:
            return None
        return dict(entry.knobs)

    def mark_scheduled(self, sig: str, func=None) -> None:
        """A template scheduled a kernel of signature ``sig`` (``func``) with its transferred knobs. A copy of a
        kernel with the kernel's own signature (a short-request branch of it) is that kernel, counted once."""
        attrs = getattr(func, "attrs", None)
        if attrs is not None and VARIANT_OF in attrs and str(attrs[VARIANT_OF]) == sig:
            return
        self.scheduled[sig] = self.scheduled.get(sig, 0) + 1

    def applied(self) -> List[dict]:
        """What reached kernels: one entry per signature, with how many kernels took it."""
        return [dict(self.by_signature[s].to_dict(), kernels=n) for s, n in self.scheduled.items()]

    @property
    def kernels(self) -> int:
        return sum(self.scheduled.values())

    def __len__(self) -> int:
        return len(self.by_signature)
