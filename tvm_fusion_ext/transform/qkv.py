"""FuseQKVProjection: projections of one input by constant weights → one matmul on concatenated weights.

Pattern
    two or more ``matmul(x, W_i)`` (optionally ``+ b_i``) reading the same ``x``, with ``W_i`` a constant
    (or ``permute_dims`` of one, as ONNX Gemm transB imports) — the Q, K and V projections of attention.
Check
    every weight is a 2-D constant with the same K and dtype (a non-constant weight cannot be concatenated at
    compile time: refused with a reason); a bias is absorbed only when it is a constant per-column vector
    and the matmul's only user is that add.
Rewrite
    ``y = matmul(x, concat(W_i)) [+ concat(b_i)]`` and ``split(y)``; each projection becomes one piece of the
    split. Dense fusion then turns the single matmul+bias into one ``fused_dense`` that reads ``x`` once.

Stock ``relax.transform.CombineParallelMatmul`` does the same only when the weights are function
parameters; ONNX imports bind them as constants, hence this pass.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional

import numpy as np
import tvm
from tvm import relax

from .report import FusionEvent, record_applied, record_refused
from .rule import const_value, int_list, static_shape

RULE_NAME = "FuseQKVProjection"


class _Member:
    def __init__(self, mm_var, weight: np.ndarray, bias: Optional[np.ndarray], out_var):
        self.mm_var = mm_var  # the matmul binding
        self.weight = weight  # [K, N_i], already un-transposed
        self.bias = bias  # [N_i] or None
        self.out_var = out_var  # binding whose value the split piece replaces (the add if bias absorbed)


def _weight_of(arg, var2val) -> Optional[np.ndarray]:
    """The constant [K, N] weight behind a matmul operand (looking through one transpose), else None."""
    value = var2val.get(arg, arg) if isinstance(arg, relax.Var) else arg
    w = const_value(value)
    if w is not None:
        return w
    if isinstance(value, relax.Call) and str(getattr(value.op, "name", "")) == "relax.permute_dims":
        inner = value.args[0]
        w = const_value(var2val.get(inner, inner) if isinstance(inner, relax.Var) else inner)
        if w is not None and w.ndim == 2 and int_list(value.attrs.axes) in (None, [1, 0]):
            return w.T
    return None


def _users(func):
    users = defaultdict(list)
    for block in func.body.blocks:
        for b in block.bindings:
            for v in relax.analysis.free_vars(b.value):
                users[v].append(b)
    for v in relax.analysis.free_vars(func.body.body):
        users[v].append(None)
    return users


def _plan(func, func_name) -> Dict[relax.Var, dict]:
    var2val = relax.analysis.get_var2val(func)
    users = _users(func)
    by_input = defaultdict(list)
    for i, block in enumerate(func.body.blocks):
        if not isinstance(block, relax.DataflowBlock):
            continue
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and str(getattr(v.op, "name", "")) == "relax.matmul":
                # per block: the split's pieces are dataflow vars, visible only inside their block
                by_input[(i, v.args[0])].append(b)
    plan = {}
    for (_, x), bindings in by_input.items():
        if len(bindings) < 2:
            continue
        xs = static_shape(x)
        members, refused = [], None
        for b in bindings:
            w = _weight_of(b.value.args[1], var2val)
            out_dtype = str(b.value.attrs.out_dtype or "")
            if w is None or w.ndim != 2:
                refused = refused or f"weight of '{b.var.name}' is not a constant 2-D tensor"
                continue
            if xs is None or len(xs) < 2 or out_dtype not in ("", "void", "None", str(w.dtype)):
                refused = refused or f"'{b.var.name}' is not a plain dense projection"
                continue
            members.append(_Member(b.var, w, None, b.var))
        if len(members) < 2:
            if refused:
                record_refused(FusionEvent(RULE_NAME, "qkv", func_name, bindings[0].var.name, refused))
            continue
        if len({(m.weight.shape[0], m.weight.dtype) for m in members}) != 1:
            record_refused(FusionEvent(RULE_NAME, "qkv", func_name, members[0].mm_var.name,
                                       "projections differ in input width or dtype"))
            continue
        for m in members:
            _absorb_bias(m, users, var2val)
        first = members[0].mm_var
        plan[first] = {"x": x, "members": members}
    return plan


def _absorb_bias(m: _Member, users, var2val):
    readers = users.get(m.mm_var, [])
    if len(readers) != 1 or readers[0] is None:
        return
    add = readers[0]
    v = add.value
    if not (isinstance(v, relax.Call) and str(getattr(v.op, "name", "")) == "relax.add"):
        return
    other = v.args[1] if v.args[0].same_as(m.mm_var) else v.args[0]
    b = const_value(var2val.get(other, other) if isinstance(other, relax.Var) else other)
    n = m.weight.shape[1]
    if b is None or b.dtype != m.weight.dtype or b.size != n or b.shape[-1] != n:
        return
    if static_shape(add.var) != static_shape(m.mm_var):  # the bias must not broadcast the output
        return
    m.bias, m.out_var = b.reshape(n), add.var


@relax.expr_functor.mutator
class _Horizontal(relax.PyExprMutator):
    def __init__(self, mod, plan, func_name):
        super().__init__(mod)
        self.plan = plan
        self.func_name = func_name
        self.pieces = {}  # out_var -> (split var, index)
        for group in plan.values():
            for i, m in enumerate(group["members"]):
                self.pieces[m.out_var] = (group, i)

    def visit_var_binding_(self, binding):
        group = self.plan.get(binding.var)
        if group is not None:
            self._emit_group(group)
        piece = self.pieces.get(binding.var)
        if piece is None:
            super().visit_var_binding_(binding)
            return
        grp, i = piece
        value = relax.TupleGetItem(grp["split"], i)
        if isinstance(binding.var, relax.DataflowVar):
            new = self.builder_.emit(value, name_hint=binding.var.name)
        else:
            new = self.builder_.emit_output(value, name_hint=binding.var.name)
        self.set_var_remap(binding.var, new)

    def _emit_group(self, group):
        members: List[_Member] = group["members"]
        x = self.visit_expr(group["x"])
        w = np.concatenate([m.weight for m in members], axis=1)
        y = self.builder_.emit(relax.op.matmul(x, relax.const(w)), name_hint="qkv")
        if any(m.bias is not None for m in members):
            b = np.concatenate([m.bias if m.bias is not None else np.zeros(m.weight.shape[1], m.weight.dtype)
                                for m in members])
            y = self.builder_.emit(relax.op.add(y, relax.const(b)), name_hint="qkv_bias")
        widths = np.cumsum([m.weight.shape[1] for m in members])[:-1].tolist()
        group["split"] = self.builder_.emit(relax.op.split(y, [int(i) for i in widths], axis=-1),
                                            name_hint="qkv_split")
        record_applied(FusionEvent(RULE_NAME, "qkv", self.func_name, members[0].mm_var.name,
                                   f"{len(members)} projections, widths {[m.weight.shape[1] for m in members]}"))


def FuseQKVProjection():  # noqa: N802
    """Module pass: parallel constant-weight projections of one input → one matmul + split."""

    def _transform(mod, _ctx):
        for gv, func in list(mod.functions_items()):
            if not isinstance(func, relax.Function):
                continue
            plan = _plan(func, gv.name_hint)
            if not plan:
                continue
            mod = mod.clone()  # a Python module pass gets the caller's module
            rw = _Horizontal(mod, plan, gv.name_hint)
            new_func = relax.analysis.remove_all_unused(rw.visit_expr(func))
            mod = rw.builder_.get()
            mod[gv] = new_func
        return mod

    return tvm.transform.module_pass(_transform, opt_level=0, name="tfx.FuseQKVProjection")
