"""RemovePadding: run every token-wise operator of an encoder on the valid tokens only (ByteTransformer's idea).

Runs on the fused graph (after every other fusion of :func:`SemanticFusion`).

Proof (a refusal names its reason and leaves the graph padded)
    * every ``fused_attention`` hides the keys where one ``attention_mask`` input ``m [B, S]`` is 0
      (:mod:`.padding_mask`);
    * a pack point ``P [B, S, hidden]`` exists before the first attention from which everything up to the
      outputs is token-wise (each (b, s) row computed from the same row only: fused dense / layernorm / rmsnorm,
      a matmul with a 2-D weight, elementwise ops whose other operands do not vary over B and S, LayerNorm on the
      last axis, reshapes / splits / permutes that keep B and S as the first two axes), the fused attentions
      excepted. The earliest such ``[B, S, ·]`` tensor is taken (after the position embeddings, which vary over S).
Rewrite
    ``idx [T]`` = flat indices of ``m != 0`` (``nonzero``, ``T`` a fresh symbolic size); ``P`` is gathered to
    ``[T, hidden]`` and every token-wise op runs on ``[T, ·]``. Outputs are scattered to ``[B, S, ·]`` with
    **padded positions set to 0**.
Attention
    *Packed (varlen)* where the mask is key-only (:func:`.padding_mask.key_only_reason`: ``g(m[b, j])``, the same
    for every head and query): ``fused_attention`` in its packed form reads Q/K/V ``[T, H, D]`` in place, with
    ``cu_seqlens [B+1]`` (the valid-token count of each sequence, summed), ``row_seq [T]`` and the mask as one
    bias per key. This is exact for *every* mask, not only right padding: packing keeps the (b, s) order, so the
    valid tokens of sequence ``b`` are the rows ``[cu[b], cu[b+1])`` whatever their positions; a query sees
    exactly the valid keys of its sequence, as the padded kernel does (there, padded keys weigh exp(<= -1e4) = 0;
    softmax does not depend on the order of its keys), each with the same bias ``g(m[b, j])``; a causal query
    sees the keys of its sequence at or before it, and the packed order of a sequence's rows is its position
    order, holes and left padding included. Positions were applied before the pack point (the pack point is
    after the position embeddings), so nothing else reads a position. Rotary attention never gets here (the
    proof refuses it).
    *Scatter/gather* otherwise (a causal triangle or a bias in the mask, a mask on the query axis): Q/K/V are
    scattered back to ``[B, S, ·]`` with zeros at padded positions, the padded attention runs with its original
    mask, its output is gathered back; correct for every mask the proof accepts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import numpy as np
import tvm
from tvm import relax

from ..ops import call_op
from .graph import FunctionGraph, const_value, int_list, op_name, same_dim, shape_dims
from .padding_mask import key_axis_reason, key_only_reason, padding_mask_input
from .report import PADDING_KIND, VARLEN_KIND, FusionEvent, record_applied, record_refused

RULE = "RemovePadding"
KIND = PADDING_KIND
#: the rule name of each attention's packed-or-not decision (its own name: ``count(RULE)`` stays one per function)
VARLEN_RULE = "VarlenAttention"

_UNARY = {"relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.relu", "relax.nn.silu", "relax.sigmoid", "relax.tanh",
          "relax.erf", "relax.exp", "relax.sqrt", "relax.rsqrt", "relax.negative", "relax.astype", "relax.clip",
          "relax.square", "relax.abs"}
_BINARY = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.power", "relax.maximum",
           "relax.minimum"}
# fused operators whose listed inputs are per-token rows; their other inputs are indexed by features only
_TOKENWISE_OPS = {"fused_dense": ("x",), "fused_layernorm": ("x", "residual"), "fused_rmsnorm": ("x", "residual")}


@dataclass
class _Region:
    """What the proof found: the mask, the pack point and the bindings that run packed."""

    mask: relax.Var
    pack_point: relax.Var
    packed: Set[relax.Var] = field(default_factory=set)  # tensors (and split tuples) that become [T, ...]
    attentions: Set[relax.Var] = field(default_factory=set)
    # attention -> None (runs packed, per sequence) or why it keeps the scatter/gather around the padded kernel
    scatter_reason: Dict[relax.Var, Optional[str]] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------
# proof
# ---------------------------------------------------------------------------------------------------

def _attention_calls(graph: FunctionGraph) -> List[Tuple[relax.Var, Dict[str, relax.Expr], dict]]:
    out = []
    for var, val in graph.var2val.items():
        call = graph.fused_call(val)
        if call is not None and call[0] == "fused_attention":
            out.append((var, call[1], call[2]))
    return sorted(out, key=lambda c: graph.position[c[0]])


def _is_rows(e, batch, seq) -> bool:
    dims = shape_dims(e)
    return dims is not None and len(dims) >= 2 and same_dim(dims[0], batch) and same_dim(dims[1], seq)


def _row_invariant(e, rank: int, graph: Optional[FunctionGraph] = None) -> bool:
    """``e`` broadcast against a ``rank``-D [B, S, …] tensor does not vary over B or S."""
    dims = shape_dims(e) if isinstance(e.ty, relax.TensorType) else []
    if dims is None:
        return False
    lead = max(len(dims) - (rank - 2), 0)  # how many of e's axes align with B and S
    if all(isinstance(d, int) and d == 1 for d in dims[:lead]):
        return True
    value = const_value(graph.value(e)) if graph is not None else None
    # a constant equal along B and S (BERT's token-type row for type 0, broadcast to [1, S, hidden])
    return value is not None and all(
        np.array_equal(value, np.broadcast_to(np.take(value, [0], axis=i), value.shape)) for i in range(lead))


def _prove(graph: FunctionGraph) -> Tuple[Optional[_Region], str, str]:
    """``(region, "", "")`` or ``(None, reason, name of the binding it is about)``."""
    attentions = _attention_calls(graph)
    mask, reason = padding_mask_input(graph, [inputs.get("mask") for _, inputs, _ in attentions])
    if mask is None:
        return None, reason, attentions[0][0].name
    for var, inputs, _ in attentions:
        why = key_axis_reason(graph, inputs["mask"], mask)
        if why is not None:
            return None, why, var.name
    batch, seq = shape_dims(mask)
    first = graph.position[attentions[0][0]]
    candidates = [v for v, pos in sorted(graph.position.items(), key=lambda kv: kv[1])
                  if pos < first and pos[0] == first[0] and _is_rows(v, batch, seq) and len(shape_dims(v)) == 3]
    best, best_at = f"no [batch, seq, hidden] tensor before the first attention '{attentions[0][0].name}'", None
    for cand in candidates:
        region, reason, at = _propagate(graph, cand, mask, batch, seq, {a for a, _, _ in attentions})
        if region is not None:
            region.scatter_reason = {a: key_only_reason(graph, inputs["mask"], mask) for a, inputs, _ in attentions}
            return region, "", ""
        # report the candidate whose proof got furthest: its obstacle is the one that matters
        if best_at is None or graph.position.get(at, (1 << 30, 0)) >= graph.position.get(best_at, (1 << 30, 0)):
            best, best_at = reason, at
    return None, best, best_at.name if best_at is not None else ""


def _propagate(graph, pack_point, mask, batch, seq, attentions):
    """Walk forward from ``pack_point``: ``(region, "", None)`` or ``(None, reason, var where it failed)``."""
    region = _Region(mask, pack_point, {pack_point})
    block = graph.block_of(pack_point)
    start = graph.position[pack_point][1]
    for binding in list(block.bindings)[start + 1:]:
        var, val = binding.var, binding.value
        reads = [v for v in relax.analysis.free_vars(val) if v in region.packed]
        if not reads:
            continue
        if isinstance(binding, relax.MatchCast):
            return None, f"match_cast '{var.name}' of a token tensor", var
        why = _tokenwise(val, graph, region, batch, seq, attentions, var)
        if why is not None:
            return None, f"'{var.name}' = {why}: it mixes tokens after the pack point '{pack_point.name}'", var
        region.packed.add(var)
    missing = [a for a in attentions if a not in region.attentions]
    if missing:
        return None, f"attention '{missing[0].name}' is not reached from the pack point '{pack_point.name}'", None
    for v in relax.analysis.free_vars(graph.func.body.body):
        if v in region.packed and not isinstance(v.ty, relax.TensorType):
            return None, f"output '{v.name}' is a tuple of token tensors", v
    for later in graph.func.body.blocks[graph.position[pack_point][0] + 1:]:
        for b in later.bindings:
            if any(v in region.packed for v in relax.analysis.free_vars(b.value)):
                return None, f"'{b.var.name}' reads token tensors in a later binding block", b.var
    return region, "", None


def _tokenwise(val, graph, region, batch, seq, attentions, var) -> Optional[str]:
    """None when ``val`` computes each token row from the same row only, else what it is."""
    packed = region.packed

    def is_packed(e):
        return isinstance(e, relax.Var) and e in packed

    if isinstance(val, relax.TupleGetItem):
        return None if is_packed(val.tuple_value) else "a tuple item"
    if isinstance(val, relax.Var):
        return None
    op = op_name(val)
    call = graph.fused_call(val)
    if call is not None:
        name, inputs, params = call
        if name == "fused_attention":
            if var not in attentions:
                return "an unknown attention"
            if not all(is_packed(inputs.get(k)) for k in ("q", "k", "v")):
                return "fused_attention with Q/K/V not all token tensors"
            layouts = [params.get(f"{k}_layout", "BSHD") for k in ("q", "k", "v", "out")]
            if any(lay != "BSHD" for lay in layouts) or params.get("q_rope", "none") != "none":
                return f"fused_attention in layouts {layouts}"
            if any(is_packed(e) for k, e in inputs.items() if k not in ("q", "k", "v")):
                return "fused_attention with a token tensor as its mask"
            region.attentions.add(var)
            return None
        rows = _TOKENWISE_OPS.get(name)
        if rows is None:
            return name
        if not is_packed(inputs.get("x")) or any(
                k in inputs and not is_packed(inputs[k]) for k in rows):
            return f"{name} mixing token rows with a padded tensor"
        if any(is_packed(e) for k, e in inputs.items() if k not in rows):
            return f"{name} with a token tensor as a weight"
        return None
    if op is None or op == "relax.call_tir":
        return op or type(val).__name__
    args = list(val.args)
    first = args[0]
    rank = len(shape_dims(first) or [])
    if op in _UNARY:
        return None
    if op in _BINARY:
        if not all(is_packed(a) or (not _is_rows(a, batch, seq) and _row_invariant(a, len(shape_dims(val)), graph))
                   for a in args):
            return f"{op} with an operand that varies over batch or sequence"
        return None
    if not is_packed(first) or any(is_packed(a) for a in args[1:]):
        return op
    if op in ("relax.nn.layer_norm", "relax.nn.rms_norm"):
        axes = int_list(val.attrs.axes)
        return None if axes in ([-1], [rank - 1]) else f"{op} over axes {axes}"
    if op == "relax.matmul":
        w = shape_dims(args[1])
        return None if w is not None and len(w) == 2 and rank >= 3 else "matmul with a batched right operand"
    if op == "relax.reshape":
        return None if _is_rows(val, batch, seq) else "a reshape merging the batch or sequence axis"
    if op == "relax.split":
        return None if int(val.attrs.axis) in (-1, rank - 1) else f"split on axis {int(val.attrs.axis)}"
    if op == "relax.permute_dims":
        axes = int_list(val.attrs.axes)
        return None if axes is not None and axes[:2] == [0, 1] else f"permute_dims {axes} moving the sequence axis"
    return op


# ---------------------------------------------------------------------------------------------------
# rewrite
# ---------------------------------------------------------------------------------------------------

@relax.expr_functor.mutator
class _Packer(relax.PyExprMutator):
    def __init__(self, mod, region: _Region, graph: FunctionGraph):
        super().__init__(mod)
        self.region = region
        self.graph = graph
        self.packed: Dict[relax.Var, relax.Expr] = {}  # old var -> its [T, ...] value in the new graph
        self.idx = self.pos = None
        self.valid = self.cu_seqlens = self.row_seq = self.key_slot = None
        self.key_bias: Dict[relax.Expr, relax.Expr] = {}  # new mask -> its packed-order [B, S] bias

    # -- index tensors --------------------------------------------------------------------------------
    def _emit_indices(self):
        bb, m = self.builder_, self.visit_expr(self.region.mask)
        batch, seq = shape_dims(self.region.mask)
        zero = relax.const(0, str(m.ty.dtype))
        flat = bb.emit(relax.op.reshape(relax.op.not_equal(m, zero), [batch * seq]), name_hint="token_valid")
        tokens = tvm.tirx.Var("packed_tokens", "int64")
        nz = bb.match_cast(relax.op.nonzero(flat), relax.TensorType([1, tokens], "int64"))
        self.idx = bb.emit(relax.op.reshape(nz, [tokens]), name_hint="token_index")
        self.valid = flat
        count = relax.op.astype(flat, "int64")
        # the packed row of each (b, s) slot, for scattering back; padded slots read the zero row appended at T
        self.pos = bb.emit(relax.op.where(flat, relax.op.subtract(relax.op.cumsum(count, axis=0),
                                                                    relax.const(1, "int64")),
                                          relax.op.sum(count)), name_hint="token_slot")

    def _emit_sequence_offsets(self):
        """``cu_seqlens [B+1]``, ``row_seq [T]`` and ``key_slot [B·S]`` (the packed row of each sequence's k-th
        valid key, T past its count), once per function, for the packed attentions. Axis indices come from
        cumulative sums of ones: no symbolic scalar is needed."""
        bb = self.builder_
        batch, seq = shape_dims(self.region.mask)
        one = relax.const(1, "int64")
        valid = bb.emit(relax.op.astype(relax.op.reshape(self.valid, [batch, seq]), "int64"))
        ones = bb.emit(relax.op.ones_like(valid))
        seq_index = bb.emit(relax.op.subtract(relax.op.cumsum(ones, axis=0), one))  # [b, s] = b
        key_index = bb.emit(relax.op.subtract(relax.op.cumsum(ones, axis=1), one))  # [b, s] = s
        counts = bb.emit(relax.op.sum(valid, axis=[1], keepdims=True))  # [B, 1]
        ends = bb.emit(relax.op.cumsum(counts, axis=0))
        self.cu_seqlens = bb.emit(relax.op.concat([relax.op.zeros(relax.ShapeExpr([1]), "int64"),
                                                   relax.op.reshape(ends, [batch])], axis=0), name_hint="cu_seqlens")
        self.row_seq = bb.emit(relax.op.take(relax.op.reshape(seq_index, [batch * seq]), self.idx, axis=0),
                               name_hint="row_seq")
        slot = relax.op.where(relax.op.less(key_index, counts),
                              relax.op.add(relax.op.subtract(ends, counts), key_index), relax.op.sum(counts))
        self.key_slot = bb.emit(relax.op.reshape(slot, [batch * seq]), name_hint="key_slot")

    def _key_bias(self, mask):
        """The key-only additive mask ``[B, ·, ·, S]`` as ``[B, S]`` in packed order: entry (b, k) is the bias of
        sequence b's k-th valid key (0 past its count, where the kernel reads nothing)."""
        if mask in self.key_bias:
            return self.key_bias[mask]
        if self.cu_seqlens is None:
            self._emit_sequence_offsets()
        bb = self.builder_
        batch, seq = shape_dims(self.region.mask)
        row = mask  # [B, ·, ·, S] (the proof's layout checks): the same for every head and query, so take one
        if any(not (isinstance(d, int) and d == 1) for d in shape_dims(mask)[1:3]):
            row = bb.emit(relax.op.strided_slice(mask, axes=[1, 2], begin=[0, 0], end=[1, 1]))
        packed = relax.op.take(relax.op.reshape(row, [batch * seq]), self.idx, axis=0)
        padded = relax.op.concat([packed, relax.op.zeros(relax.ShapeExpr([1]), str(mask.ty.dtype))], axis=0)
        bias = bb.emit(relax.op.reshape(relax.op.take(padded, self.key_slot, axis=0), [batch, seq]),
                       name_hint="key_bias")
        self.key_bias[mask] = bias
        return bias

    def _packed_attention(self, inputs, params, var):
        """The packed form on Q/K/V ``[T, H, D]`` (one batch of T rows), its output back to ``[T, H, D]``."""
        bb = self.builder_
        qkv = {}
        for name in ("q", "k", "v"):
            x = self._arg(inputs[name])
            qkv[name] = bb.emit(relax.op.reshape(x, [1, *shape_dims(x)]))
        bias = self._key_bias(self.visit_expr(inputs["mask"]))
        out = bb.emit(call_op(bb, "fused_attention", {**qkv, "cu_seqlens": self.cu_seqlens, "row_seq": self.row_seq,
                                                      "key_bias": bias}, params), name_hint=f"{var.name}_packed")
        return relax.op.reshape(out, shape_dims(out)[1:])

    def _pack(self, x):
        dims = shape_dims(x)
        rows = self.builder_.emit(relax.op.reshape(x, [dims[0] * dims[1], *dims[2:]]))
        return self.builder_.emit(relax.op.take(rows, self.idx, axis=0), name_hint="packed")

    def _unpack(self, x, like):
        dims, dt = shape_dims(like), str(like.ty.dtype)
        zero_row = relax.op.zeros(relax.ShapeExpr([1, *dims[2:]]), dt)
        rows = self.builder_.emit(relax.op.concat([x, zero_row], axis=0))
        flat = self.builder_.emit(relax.op.take(rows, self.pos, axis=0))
        return relax.op.reshape(flat, dims)

    # -- bindings ------------------------------------------------------------------------------------
    def visit_var_binding_(self, binding):
        var = binding.var
        if var.same_as(self.region.pack_point):
            super().visit_var_binding_(binding)
            self._emit_indices()
            self.packed[var] = self._pack(self.visit_expr(var))
            return
        if var not in self.region.packed:
            super().visit_var_binding_(binding)
            return
        new = self.builder_.emit(self._packed_value(binding.value, var), name_hint=var.name)
        self.packed[var] = new
        if not isinstance(var, relax.DataflowVar):  # a function output: back to [B, S, ...], padding zeroed
            self.set_var_remap(var, self.builder_.emit_output(self._unpack(new, var), name_hint=var.name))

    def _arg(self, e):
        return self.packed[e] if isinstance(e, relax.Var) and e in self.packed else self.visit_expr(e)

    def _packed_value(self, val, var) -> relax.Expr:
        bb = self.builder_
        if isinstance(val, relax.TupleGetItem):
            return relax.TupleGetItem(self._arg(val.tuple_value), val.index)
        if isinstance(val, relax.Var):
            return self._arg(val)
        op = op_name(val)
        call = self.graph.fused_call(val)
        if call is not None:
            name, inputs, params = call
            if name == "fused_attention" and var in self.region.scatter_reason and \
                    self.region.scatter_reason[var] is None:
                return self._packed_attention(inputs, params, var)
            if name == "fused_attention":
                inputs = {k: (self._unpack_emit(self._arg(e), e) if k in ("q", "k", "v") else self._arg(e))
                          for k, e in inputs.items()}
                out = bb.emit(call_op(bb, name, inputs, params), name_hint=f"{var.name}_padded")
                return relax.op.take(bb.emit(relax.op.reshape(out, [shape_dims(out)[0] * shape_dims(out)[1],
                                                                    *shape_dims(out)[2:]])),
                                     self.idx, axis=0)
            return call_op(bb, name, {k: self._arg(e) for k, e in inputs.items()}, params)
        args = [self._arg(a) for a in val.args]
        if op in _BINARY:
            args = [a if a_old in self.packed else self._drop_batch_axis(a, len(shape_dims(var)))
                    for a, a_old in zip(args, val.args)]
            return relax.Call(val.op, args, val.attrs, val.ty_args)
        if op == "relax.nn.layer_norm":
            a = val.attrs
            return relax.op.nn.layer_norm(args[0], args[1], args[2], axes=[-1], epsilon=a.epsilon,
                                          center=a.center, scale=a.scale)
        if op == "relax.nn.rms_norm":
            return relax.op.nn.rms_norm(args[0], args[1], axes=[-1], epsilon=val.attrs.epsilon)
        if op == "relax.reshape":
            dims = shape_dims(var)
            return relax.op.reshape(args[0], [shape_dims(args[0])[0], *dims[2:]])
        if op == "relax.split":
            return relax.op.split(args[0], val.attrs.indices_or_sections, axis=-1)
        if op == "relax.permute_dims":
            axes = int_list(val.attrs.axes)
            return relax.op.permute_dims(args[0], [0] + [a - 1 for a in axes[2:]])
        return relax.Call(val.op, args, val.attrs, val.ty_args)  # unary ops, matmul with a 2-D weight

    def _unpack_emit(self, new, old):
        return self.builder_.emit(self._unpack(new, old))

    def _drop_batch_axis(self, a, rank):
        """A row-invariant operand whose axes reach B and S gets one axis of 1 there instead, like the rows."""
        dims = shape_dims(a) if isinstance(a.ty, relax.TensorType) else None
        if dims is None or len(dims) < rank - 1:
            return a
        lead = len(dims) - (rank - 2)
        value = const_value(self.graph.value(a))  # None unless a constant
        if value is not None:  # maybe uniform rather than 1 along B and S: keep its first row
            row = value[(0,) * lead]
            return relax.const(row.reshape((1, *row.shape)), str(value.dtype))
        return self.builder_.emit(relax.op.reshape(a, [1, *dims[lead:]]))


def remove_padding(mod: tvm.IRModule) -> tvm.IRModule:
    """The rewrite on every Relax function of ``mod`` where the proof holds (``mod`` itself when none)."""
    plans = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or (func.attrs is not None and "Primitive" in func.attrs):
            continue
        graph = FunctionGraph(func, mod)
        if not _attention_calls(graph):
            continue  # nothing that padding could be removed around: not a near miss
        region, reason, at = _prove(graph)
        if region is None:
            record_refused(FusionEvent(RULE, KIND, gv.name_hint, at, reason))
        else:
            plans[gv] = (region, graph)
    if not plans:
        return mod
    mod = mod.clone()
    for gv, (region, graph) in plans.items():
        rw = _Packer(mod, region, graph)
        new_func = relax.analysis.remove_all_unused(rw.visit_expr(mod[gv]))
        mod = rw.builder_.get()
        mod[gv] = new_func
        record_applied(FusionEvent(RULE, KIND, gv.name_hint, region.pack_point.name,
                                   f"mask '{region.mask.name}', {len(region.attentions)} attention(s), "
                                   f"{len(region.packed)} token-wise binding(s)"))
        for attention, reason in sorted(region.scatter_reason.items(), key=lambda kv: graph.position[kv[0]]):
            if reason is None:
                record_applied(FusionEvent(VARLEN_RULE, VARLEN_KIND, gv.name_hint, attention.name,
                                           "packed per sequence (cu_seqlens)"))
            else:  # correct either way: the padded kernel runs between a scatter and a gather
                record_refused(FusionEvent(VARLEN_RULE, VARLEN_KIND, gv.name_hint, attention.name,
                                           f"{reason}: attention runs padded (scatter/gather)"))
    return mod


def RemovePadding() -> tvm.transform.Pass:  # noqa: N802  (TVM pass naming)
    return tvm.transform.module_pass(lambda mod, _ctx: remove_padding(mod), opt_level=0, name="tfx.RemovePadding")
