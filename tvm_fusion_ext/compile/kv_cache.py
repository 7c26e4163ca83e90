"""How a KV-cache decoder keeps its cache: ``concat`` (as exported) or ``inplace`` (preallocated, written in place).

A decoder exported for generation (Optimum's and ONNX Runtime GenAI's form: ``past_key_values.{i}.key/value``
``[batch, kv_heads, past, head_dim]`` in, ``present.{i}.key/value`` out) concatenates its past and the step's new
keys/values into ``present``: every step copies the whole cache (a read and a write of ``past`` rows per layer).

``kv_cache="inplace"`` builds the same model with each past input a buffer of a fixed capacity ``[batch,
kv_heads, capacity, head_dim]`` (the capacity: the past dim's upper bound, ``--max-shape``), and one more input,
``past_length`` (int64 ``[1]``): how many positions of the buffers hold keys already. The step writes its new
keys/values at positions ``[past_length, past_length + new)`` of the very buffers it was given
(``R.call_tir_inplace``: no copy), attention reads keys ``[0, past_length + new)`` out of the whole buffer
(``fused_attention``'s ``preallocated_kv``) and each ``present`` output *is* its past buffer, updated. A
generation loop allocates the buffers once and passes them back every step with ``past_length`` advanced
(:func:`~tvm_fusion_ext.deploy.generate.generate` does). Positions and masks the graph computes from the past's
length see ``past_length``: the past dim stays the same symbolic variable, now defined by ``past_length`` instead
of by the buffers' shape.

A sliding-window export (Mistral's, Gemma2's) crops its past, and its present, to the window's last ``window - 1``
positions. When the capacity is no longer than that, no crop ever drops a position (a step that would hold more
than the capacity is refused before it runs): :func:`drop_crops_within_capacity` removes them before fusion, so
the attention and its grouped K/V heads fuse on the plain ``past + new`` keys. A shorter window would drop the
oldest positions of a buffer written in place, and is refused.

What it refuses, in one line: a model without past inputs, a past read by anything other than its concatenation
with the new keys/values along the sequence axis (an encoder-decoder's cross-attention cache is passed through
unchanged, for one), a sliding window shorter than the capacity, a concatenation whose result feeds anything
other than a fused attention and the outputs, and a past dim pinned to a number (``--shape``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import tvm
from tvm import relax, sym, tirx
from tvm.script import tirx as T

from ..errors import InputError
from ..ops.registry import call_op, params_of
from ..transform.graph import static_ints
from .lowering.operator_calls import operator_call

KV_CACHES = ("concat", "inplace")
#: the input the in-place build adds: how many cached positions the buffers hold
PAST_LENGTH = "past_length"
_CONCAT = tvm.ir.Op.get("relax.concat")


@dataclass
class KVCacheReport:
    """What ``kv_cache`` changed: recorded in the artifact's manifest (``kv_cache``)."""

    mode: str = "concat"
    capacity: Optional[int] = None           # positions each past buffer holds (inplace)
    past_inputs: List[str] = field(default_factory=list)
    length_input: Optional[str] = None       # PAST_LENGTH (inplace)
    past_dim: Optional[str] = None           # the symbolic past length the buffers' shape no longer shows

    def to_json(self) -> dict:
        out = {"mode": self.mode}
        if self.mode == "inplace":
            out.update(capacity=self.capacity, past_inputs=list(self.past_inputs), length_input=self.length_input,
                       past_dim=self.past_dim)
        return out

    def input_specs(self, specs: Dict[str, tuple]) -> Dict[str, tuple]:
        """The compiled model's ``{input: (shape, dtype)}`` given the exported model's: each past input at the
        capacity, ``past_length`` after the model's inputs."""
        if self.mode != "inplace":
            return dict(specs)
        out = {}
        for name, (shape, dtype) in specs.items():
            out[name] = ((*shape[:2], self.capacity, *shape[3:]), dtype) if name in self.past_inputs else (shape, dtype)
        out[self.length_input] = ((1,), "int64")
        return out


def check_kv_cache(mode) -> str:
    mode = "concat" if mode is None else str(mode).lower()
    if mode not in KV_CACHES:
        raise InputError(f"kv_cache must be one of {', '.join(KV_CACHES)}, got '{mode}'")
    return mode


def apply_kv_cache(mod: tvm.IRModule, mode: str):
    """``(module, KVCacheReport)``: ``mod`` (fused) unchanged for ``concat``; rewritten for ``inplace``."""
    mode = check_kv_cache(mode)
    if mode == "concat":
        return mod, KVCacheReport()
    return _inplace(mod)


def drop_crops_within_capacity(mod: tvm.IRModule, mode: str) -> tvm.IRModule:
    """For ``inplace``, before fusion: the pasts the new keys/values join get one length variable (the one
    ``past_length`` will define), and each crop of a past, or of its concatenation with the new keys/values, to
    last positions at least as many as the capacity is replaced by what it crops (it never drops a position)."""
    if check_kv_cache(mode) != "inplace" or "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        return mod
    func = mod["main"]
    bounds = func.attrs.get("tir_var_upper_bound") if func.attrs else None
    past = [p for p, _ in _past_inputs(func)[2]]
    dims = []
    for p in _joined_pasts(func, past):
        shape = p.ty.shape.values if isinstance(p.ty, relax.TensorType) and p.ty.shape is not None else None
        if shape is None or len(shape) != 4 or not isinstance(shape[2], tirx.Var):
            return mod  # _inplace refuses it, naming why
        if not any(shape[2].same_as(d) for d in dims):
            dims.append(shape[2])
    if not dims or bounds is None or str(dims[0]) not in bounds:
        return mod
    if len(dims) > 1:
        # torch's dynamo exporter names the pasts' lengths alike only when the graph shows them equal, which a
        # crop hides; one past_length defines every past the new rows join, so they are one variable here
        gv = mod.get_global_var("main")
        mod = mod.clone()
        mod[gv] = func = func.bind_symbolic_vars({d: dims[0] for d in dims[1:]})
        past = [p for p, _ in _past_inputs(func)[2]]
    return _CropDropper(mod, set(past), dims[0], int(bounds[str(dims[0])])).run()


def _joined_pasts(func: relax.Function, past: list) -> list:
    """The pasts the new rows are concatenated to along the sequence axis (directly, or after a crop or a
    one-input concatenation): a self-attention cache, not a cross-attention one passed through."""
    source = {p: p for p in past}
    joined = set()
    for b in (b for block in func.body.blocks for b in block.bindings):
        cat = _joined(b.value)
        if _kept_positions(b) is not None and b.value.args[0] in source:
            source[b.var] = source[b.value.args[0]]
        elif cat is not None and cat[2] in (2, -2) and cat[0] in source:
            if cat[1]:
                joined.add(source[cat[0]])
            else:
                source[b.var] = source[cat[0]]
    return [p for p in past if p in joined]


@relax.expr_functor.mutator
class _CropDropper(relax.PyExprMutator):
    """Drops the crops; shapes the graph computed from a cropped length (a repeat of grouped K/V heads expanded to
    it) are simplified knowing the past holds at most ``capacity`` positions, so they read ``past + new`` again."""

    def __init__(self, mod, past, dim, capacity):
        super().__init__(mod)
        self.mod, self.capacity = mod, capacity
        self.cached = set(past)  # pasts, and concatenations of a past with new rows along the sequence axis
        self.analyzer = sym.Analyzer()
        self.analyzer.bind(dim, tvm.ir.Range(0, capacity + 1))

    def visit_shape_expr_(self, op):
        return relax.ShapeExpr([self.analyzer.simplify(v) for v in op.values])

    def run(self) -> tvm.IRModule:
        gv = self.mod.get_global_var("main")
        self.builder_.update_func(gv, self.visit_expr(self.mod["main"]))
        return self.builder_.get()

    def visit_var_binding_(self, binding):
        value = binding.value
        kept = _kept_positions(binding)
        if kept is not None and kept >= self.capacity and value.args[0] in self.cached:
            self.set_var_remap(binding.var, self.visit_expr(value.args[0]))
            self.cached.add(binding.var)
            return
        joined = _joined(value)  # with new rows, or alone (an exporter's one-input Concat)
        if joined is not None and joined[2] in (2, -2) and joined[0] in self.cached:
            self.cached.add(binding.var)
        super().visit_var_binding_(binding)


def _past_inputs(func: relax.Function):
    """``(input names, number of inputs, [(past param, name)])``: the ONNX inputs named as a KV cache's past."""
    names = [str(n) for n in func.attrs["onnx_input_names"]] if func.attrs and "onnx_input_names" in func.attrs \
        else [p.name for p in func.params]
    num_input = int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs else len(func.params)
    return names, num_input, [(p, n) for p, n in zip(func.params[:num_input], names) if "past" in n.lower()]


def _refuse(text: str):
    raise InputError(f"kv_cache=inplace: {text}")


def _inplace(mod: tvm.IRModule):
    gv = mod.get_global_var("main")
    func = mod[gv]
    names, num_input, past = _past_inputs(func)
    if not past:
        _refuse(f"the model has no past (KV cache) inputs (inputs: {', '.join(names[:num_input])})")
    if PAST_LENGTH in names:
        _refuse(f"the model already has an input named '{PAST_LENGTH}'")
    length = _past_dim(past)
    bounds = func.attrs.get("tir_var_upper_bound") if func.attrs else None
    if bounds is None or str(length) not in bounds:
        _refuse(f"the past length '{length}' has no upper bound to size the cache by (give --max-shape)")
    capacity = int(bounds[str(length)])
    concats = _concats(mod, func, {p for p, _ in past}, dict(past), capacity)
    buffers = {}
    for p, name in past:
        b, h, _, d = p.ty.shape.values
        buffers[p] = relax.Var(p.name, relax.TensorType([b, h, capacity, d], p.ty.dtype))
    past_length = relax.Var(PAST_LENGTH, relax.TensorType([1], "int64"))
    writer = _Writer(mod, concats, buffers, past_length)
    body = writer.visit_expr(func.body)
    shape = relax.Var("past_length_shape", relax.ShapeType(ndim=1))
    head = relax.BindingBlock([relax.VarBinding(shape, relax.op.tensor_to_shape(past_length)),
                               relax.MatchCast(relax.Var("past_length_dim", relax.ShapeType([length])), shape,
                                               relax.ShapeType([length]))])
    body = relax.SeqExpr([head, *body.blocks], body.body)
    params = [buffers.get(p, p) for p in func.params[:num_input]] + [past_length] + list(func.params[num_input:])
    attrs = dict(func.attrs) if func.attrs else {}
    attrs["onnx_input_names"] = names[:num_input] + [PAST_LENGTH] + names[num_input:]
    attrs["num_input"] = num_input + 1
    new = relax.Function(params, body, body.body.ty, func.is_pure)
    for key, value in attrs.items():
        new = new.with_attr(key, value)
    out = writer.builder_.get()
    out[gv] = new
    out = relax.transform.Normalize()(out)
    out = relax.transform.DeadCodeElimination()(out)
    report = KVCacheReport("inplace", capacity, [n for _, n in past], PAST_LENGTH, str(length))
    return out, report


def _past_dim(past) -> tirx.Var:
    dims = set()
    for p, name in past:
        shape = p.ty.shape.values if isinstance(p.ty, relax.TensorType) and p.ty.shape is not None else None
        if shape is None or len(shape) != 4:
            _refuse(f"past input '{name}' is not a [batch, heads, past, head_dim] tensor")
        if not isinstance(shape[2], tirx.Var):
            pinned = int(shape[2]) if isinstance(shape[2], tirx.IntImm) else shape[2]
            _refuse(f"past input '{name}' has its past dim pinned to {pinned} (--shape): the length must be "
                    f"dynamic, given by '{PAST_LENGTH}'")
        dims.add(shape[2])
    if len(dims) != 1:
        _refuse(f"past inputs disagree on their past dim ({', '.join(sorted(map(str, dims)))})")
    return dims.pop()


def _concats(mod, func: relax.Function, past: set, names: Dict[relax.Var, str],
             capacity: int) -> Dict[relax.Var, tuple]:
    """``{concat result var: (past var, new var)}``, after checking that nothing else reads a past or a present."""
    uses: Dict[relax.Var, list] = {}
    concats = {}
    bindings = [b for block in func.body.blocks for b in block.bindings]

    def reads(expr):
        return [expr] if isinstance(expr, relax.Var) else list(relax.analysis.free_vars(expr))

    for b in bindings:
        joined = _joined(b.value)
        if joined is not None and len(joined[1]) == 1 and joined[0] in past:
            cached, (new,), axis = joined
            if axis not in (2, -2):
                _refuse(f"past input '{names[cached]}' is concatenated along axis {axis}, not the sequence axis")
            if cached in {p for p, _ in concats.values()}:
                _refuse(f"past input '{names[cached]}' is concatenated twice")
            concats[b.var] = (cached, new)
            for v in reads(new):
                uses.setdefault(v, []).append(b)
            continue
        for v in reads(b.value):
            uses.setdefault(v, []).append(b)
    for v in relax.analysis.free_vars(func.body.body) if not isinstance(func.body.body, relax.Var) \
            else [func.body.body]:
        uses.setdefault(v, []).append(None)
    for p in past:
        kept = _kept_positions(uses[p][0]) if p in uses else None
        if kept is not None:
            _refuse(f"past input '{names[p]}' is cropped to its last {kept} positions before the new keys/values "
                    f"join it (a sliding-window cache), fewer than the capacity of {capacity}: a buffer written in "
                    f"place cannot drop its oldest positions; compile with --kv-cache concat, or bound the past to "
                    f"at most {kept} positions (--max-shape)")
        if p in uses:
            _refuse(f"past input '{names[p]}' is read by {_what(uses[p][0])}, not only by its concatenation with "
                    f"the new keys/values (a cross-attention cache, or a cache this build cannot write in place)")
        if p not in {q for q, _ in concats.values()}:
            _refuse(f"past input '{names[p]}' is never concatenated with new keys/values")
    outputs = _output_vars(func, bindings)
    for var in concats:
        for user in uses.get(var, []):
            if user is None or user.var in outputs:
                continue
            if not _is_attention(mod, user.value):
                _refuse(f"the concatenation of past input '{names[concats[var][0]]}' is read by {_what(user)}, "
                        f"not only by the attention and the outputs")
    return concats


def _joined(value):
    """``(first, [the others], axis)`` when ``value`` is a concatenation, else None."""
    if not (isinstance(value, relax.Call) and value.op == _CONCAT and isinstance(value.args[0], relax.Tuple)
            and value.args[0].fields):
        return None
    first, *others = value.args[0].fields
    return first, others, int(value.attrs.axis) if value.attrs.axis is not None else 0


def _output_vars(func, bindings) -> set:
    """Vars bound to a tuple of the function's outputs (the return value, possibly through one tuple binding)."""
    ret = func.body.body
    out = {ret} if isinstance(ret, relax.Var) else set()
    for b in bindings:
        if b.var in out and isinstance(b.value, relax.Tuple):
            out.add(b.var)
    return out


def _is_attention(mod, value) -> bool:
    found = operator_call(mod, value) if isinstance(value, relax.Call) else None
    return found is not None and found[0] == "fused_attention"


def _kept_positions(binding) -> Optional[int]:
    """How many last positions a binding that slices a ``[batch, heads, past, head_dim]`` tensor along its sequence
    axis keeps (``x[:, :, -n:]``: n), None when it is no such crop."""
    value = None if binding is None else binding.value
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name == "relax.strided_slice" and len(value.args) > 3):
        return None
    axes, begins, ends = (static_ints(value.args[i]) for i in (1, 2, 3))
    strides = static_ints(value.args[4]) if len(value.args) > 4 else None
    if not axes or not begins or not ends or len(axes) != 1 or axes[0] not in (2, -2):
        return None
    if begins[0] >= 0 or ends[0] < 0 or (strides and strides[0] != 1):
        return None
    return -begins[0]


def _what(binding) -> str:
    if binding is None:
        return "an output"
    value = binding.value
    if isinstance(value, relax.Call):
        op = value.op.name if isinstance(value.op, tvm.ir.Op) else str(value.op)
        if op == "relax.call_tir":
            return f"kernel {value.args[0].name_hint}"
        return op
    return type(value).__name__


@relax.expr_functor.mutator
class _Writer(relax.PyExprMutator):
    """Each past/new concatenation becomes an in-place write into the past buffer; attentions read the buffers."""

    def __init__(self, mod, concats, buffers, past_length):
        super().__init__(mod)
        self.mod = mod
        self.concats = concats
        self.buffers = buffers
        self.past_length = past_length
        self.writes: Dict[tuple, relax.GlobalVar] = {}
        self.written = set()

    def visit_var_binding_(self, binding):
        if binding.var in self.concats:
            past, new = self.concats[binding.var]
            buf = self.buffers[past]
            new = self.visit_expr(new)
            gv = self._write_func(buf.ty, new.ty)
            call = relax.op.call_tir_inplace(gv, relax.Tuple([buf, new, self.past_length]), [0], buf.ty)
            var = self._emit(binding.var, call)
            self.written.add(var)
            return
        found = operator_call(self.mod, binding.value) if isinstance(binding.value, relax.Call) else None
        if found is not None and found[0] == "fused_attention":
            op, func, inputs = found
            given = {n: self.visit_expr(e) for n, e in inputs.items()}
            if any(given.get(n) in self.written for n in ("k", "v")):
                if given.get("mask") is None:
                    _refuse(f"attention {binding.value.args[0].name_hint} has no mask to count the cached keys by")
                if not all(given.get(n) in self.written for n in ("k", "v")):
                    _refuse(f"attention {binding.value.args[0].name_hint} reads one of K and V from the cache and "
                            f"the other from elsewhere")
                call = call_op(self.builder_, op, given, dict(params_of(func), preallocated_kv=True))
                self._emit(binding.var, call)
                return
        super().visit_var_binding_(binding)

    def _emit(self, var, call):
        emit = self.builder_.emit if isinstance(var, relax.DataflowVar) else self.builder_.emit_output
        new = emit(call, name_hint=var.name)
        self.set_var_remap(var, new)
        return new

    def _write_func(self, cache_ty, new_ty) -> relax.GlobalVar:
        b, h, cap, d = cache_ty.shape.values
        key = (int(h), int(cap), int(d), str(cache_ty.dtype))
        if key not in self.writes:
            self.writes[key] = self.builder_.add_func(write_kv(*key), "kv_cache_write")
        return self.writes[key]


def write_kv(heads: int, capacity: int, head_dim: int, dtype: str) -> tirx.PrimFunc:
    """``cache[:, :, P + s, :] = new[:, :, s, :]`` for the ``new`` rows, ``P = past_length[0]``: the in-place
    write of one step's keys (or values). Rows past the capacity are not written (the run-time checks refuse
    such a step before it runs; a raw call drops them rather than write past the buffer)."""
    H, L, D = (T.int64(x) for x in (heads, capacity, head_dim))

    @T.prim_func(private=True, s_tir=True)
    def kv_cache_write(c: T.handle, n: T.handle, p: T.handle):
        T.func_attr({"tir.noalias": True})
        batch, rows = T.int64(), T.int64()
        cache = T.match_buffer(c, (batch, H, L, D), dtype)
        new = T.match_buffer(n, (batch, H, rows, D), dtype)
        past = T.match_buffer(p, (T.int64(1),), "int64")
        for i0, i1, i2, i3 in T.grid(batch, H, rows, D):
            with T.sblock("kv_cache_write"):
                vb, vh, vs, vd = T.axis.remap("SSSS", [i0, i1, i2, i3])
                T.reads(new[vb, vh, vs, vd], past[0])
                T.writes(cache[vb, vh, past[0] + vs, vd])
                if past[0] + vs >= T.int64(0) and past[0] + vs < L:
                    cache[vb, vh, past[0] + vs, vd] = new[vb, vh, vs, vd]

    return kv_cache_write
