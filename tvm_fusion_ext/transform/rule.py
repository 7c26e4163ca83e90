"""The one base every fusion rule uses: pattern variants, a check that returns a reason, a rewrite.

A rule says *what* to look for (``variants``), *whether* a structural match is semantically safe to replace
(``check`` returns ``None`` to accept or a one-line reason to refuse) and *what* to put in its place
(``rewrite``). The engine (:func:`apply_rules`) owns everything rules must not get wrong individually:

* greedy matching from the end of each dataflow block backwards, so the largest pattern anchored at the most
  downstream binding wins (``matmul+add+gelu`` before ``matmul+add``) and a binding absorbed by one fusion is
  never the root of another;
* the leak check: an intermediate of the match used outside it refuses the match (rewriting would compute it
  twice or change what the other user sees);
* type preservation: a rewrite must produce exactly the struct info of the binding it replaces;
* reporting: accepted and refused matches go to every active :class:`FusionReport`;
* identity: a pass that fires nowhere returns its input module unchanged (same object).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import DFPattern, WildcardPattern

from .report import FusionEvent, record_applied, record_refused


@dataclass
class Variant:
    """One spelling of a rule's pattern: ``root`` plus the sub-patterns the rule wants by name."""

    root: DFPattern
    names: Dict[str, DFPattern]
    tag: dict = field(default_factory=dict)  # free-form facts about this spelling (e.g. {"act": "gelu"})
    #: the root's operator name ("relax.matmul"), when it has one: lets the engine skip the matcher cheaply
    root_op: Optional[str] = None


class Match:
    """A structural match of one variant, anchored at one binding of the original function."""

    def __init__(self, rule, variant: Variant, func_name: str, root_var: relax.Var,
                 matched: dict, var2val: dict, val2var: Optional[dict] = None):
        self.rule = rule
        self.variant = variant
        self.tag = variant.tag
        self.func_name = func_name
        self.root_var = root_var
        self._matched = matched
        self._var2val = var2val
        self._val2var = val2var or {}
        self._remap: Optional[Callable] = None

    # -- reading the match (original graph) ---------------------------------------------------------
    def has(self, name: str) -> bool:
        pat = self.variant.names.get(name)
        return pat is not None and pat in self._matched

    def __getitem__(self, name: str) -> relax.Expr:
        pat = self.variant.names[name]
        e = self._matched[pat]
        if isinstance(pat, WildcardPattern):
            # dpl records a wildcard bound to a variable as the variable's *value*; an input is the variable
            return self._val2var.get(e, e)
        return e

    def value(self, name: str) -> relax.Expr:
        """The matched expression with one level of variable binding looked through."""
        e = self[name]
        return self._var2val.get(e, e) if isinstance(e, relax.Var) else e

    def const(self, name: str) -> Optional[np.ndarray]:
        return const_value(self.value(name))

    def scalar(self, name: str) -> Optional[float]:
        return scalar_value(self.value(name))

    def shape(self, name: str) -> Optional[List[int]]:
        return static_shape(self[name])

    def dtype(self, name: str) -> str:
        return str(self[name].ty.dtype)

    # -- building the replacement -------------------------------------------------------------------
    def arg(self, name: str) -> relax.Expr:
        """The matched input as it exists in the function being rebuilt (use inside ``rewrite``)."""
        return self._remap(self[name])

    def arg_remap(self, expr: relax.Expr) -> relax.Expr:
        """Any expression of the original graph as it exists in the function being rebuilt."""
        return self._remap(expr)


class FusionRule:
    """Base class. Subclasses set ``name`` and ``kind`` and implement the three methods below."""

    name: str = "FusionRule"
    #: report bucket: "dense", "attention", "layernorm", "qkv" or "canonical"
    kind: str = "canonical"

    def variants(self) -> List[Variant]:
        """Pattern spellings, most specific first. Built once per rule instance."""
        raise NotImplementedError

    def check(self, m: Match) -> Optional[str]:
        """``None`` to accept the match, else a one-line reason (it lands in the FusionReport)."""
        return None

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        """The replacement for ``m.root_var``'s value, built from ``m.arg(...)`` inputs."""
        raise NotImplementedError

    def describe(self, m: Match) -> str:
        """Short text for the report's accepted entry (what exactly was fused)."""
        return ", ".join(f"{k}={v}" for k, v in m.tag.items())

    # cached variants
    def _variants(self) -> List[Variant]:
        if not hasattr(self, "_variant_cache"):
            self._variant_cache = list(self.variants())
        return self._variant_cache


# ---------------------------------------------------------------------------------------------------
# constant helpers shared by rules
# ---------------------------------------------------------------------------------------------------

def const_value(e) -> Optional[np.ndarray]:
    if isinstance(e, tvm.ir.GenericConst):  # 0.27 spelling of relax.Constant
        return e.value.numpy()
    return None


def scalar_value(e) -> Optional[float]:
    v = const_value(e)
    if v is None or v.size != 1:
        return None
    return float(v.reshape(()))


def uniform_value(e) -> Optional[float]:
    """The value of a constant whose elements are all equal (scalars and splats), else None."""
    v = const_value(e)
    if v is None or v.size == 0:
        return None
    flat = v.reshape(-1)
    if v.dtype == bool:
        return float(flat[0]) if (flat == flat[0]).all() else None
    first = flat[0]
    same = (flat == first) | (np.isnan(flat) & np.isnan(first)) if np.issubdtype(v.dtype, np.floating) \
        else (flat == first)
    return float(first) if same.all() else None


def is_close(value: Optional[float], ref: float, rel: float = 1e-4) -> bool:
    """Constants exported as fp32 are within a few ulps of their exact values; near misses are not."""
    return value is not None and abs(value - ref) <= rel * max(1.0, abs(ref))


def static_shape(e) -> Optional[List[int]]:
    ty = getattr(e, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    try:
        return [int(d) for d in ty.shape.values]
    except (TypeError, AttributeError):
        return None


def per_column_bias_error(shape: Optional[List[int]], width: int, out_rank: int) -> Optional[str]:
    """Why a bias of ``shape`` is not one value per output column (``[N]`` or ``[1, …, 1, N]``), else None."""
    if not shape or len(shape) > out_rank or shape[-1] != width or any(d != 1 for d in shape[:-1]):
        return f"bias of shape {shape} is not a per-column bias for output width {width}"
    return None


def as_vector(bb: relax.BlockBuilder, bias: relax.Expr) -> relax.Expr:
    """A ``[1, …, 1, N]`` bias as ``[N]`` (a free view); a vector is returned as is."""
    shape = static_shape(bias)
    return bias if len(shape) == 1 else bb.emit(relax.op.reshape(bias, [shape[-1]]))


def int_list(arr) -> Optional[List[int]]:
    if arr is None:
        return None
    return [int(a) for a in arr]


# ---------------------------------------------------------------------------------------------------
# the engine
# ---------------------------------------------------------------------------------------------------

def _users(func: relax.Function) -> Dict[relax.Var, set]:
    """var -> set of binding vars that read it (``None`` = read by the function's result)."""
    users: Dict[relax.Var, set] = defaultdict(set)
    for block in func.body.blocks:
        for b in block.bindings:
            for v in relax.analysis.free_vars(b.value):
                users[v].add(b.var)
    for v in relax.analysis.free_vars(func.body.body):
        users[v].add(None)
    return users


def _plan(func: relax.Function, func_name: str, rules: List[FusionRule]):
    var2val = relax.analysis.get_var2val(func)
    val2var = {val: var for var, val in var2val.items()}
    users = _users(func)
    plan: Dict[relax.Var, Match] = {}
    claimed = set()
    # bindings inside an already-refused match: the same rule's smaller matches there are the same near
    # miss seen again, so they are not reported twice (they may still be accepted)
    refusal_cover: Dict[relax.Var, set] = defaultdict(set)
    for block in reversed(list(func.body.blocks)):
        if not isinstance(block, relax.DataflowBlock):
            continue
        for binding in reversed(list(block.bindings)):
            if not isinstance(binding, relax.VarBinding) or binding.var in claimed:
                continue
            refusal = None
            root_op = _op_name(binding.value)
            for rule in rules:
                accepted = None
                for variant in rule._variants():
                    if variant.root_op is not None and variant.root_op != root_op:
                        continue
                    matched = variant.root.extract_matched_expr(binding.value, var2val)
                    if matched is None:
                        continue
                    m = Match(rule, variant, func_name, binding.var, matched, var2val, val2var)
                    inner = {val2var[e] for pat, e in matched.items()
                             if not isinstance(pat, WildcardPattern)  # wildcards are the match's inputs
                             and isinstance(e, (relax.Call, relax.Tuple, relax.TupleGetItem)) and e in val2var}
                    inner.discard(binding.var)
                    reason = _leak(inner, users, binding.var) or rule.check(m)
                    if reason is None:
                        accepted = (m, inner)
                        break
                    if refusal is None:
                        refusal = (rule, m, reason, inner)
                if accepted is not None:
                    m, inner = accepted
                    plan[binding.var] = m
                    claimed |= inner
                    refusal = None
                    break
            if refusal is not None:
                rule, m, reason, inner = refusal
                for v in inner:
                    refusal_cover[v].add(rule.name)
                if rule.name not in refusal_cover.get(binding.var, ()):
                    record_refused(FusionEvent(rule.name, rule.kind, func_name, binding.var.name, reason))
    return plan


def _op_name(value) -> Optional[str]:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return str(value.op.name)
    return None


def _leak(inner, users, root) -> Optional[str]:
    allowed = set(inner) | {root}
    for v in inner:
        outside = [u for u in users.get(v, ()) if u not in allowed]
        if outside:
            who = "the function result" if None in outside else outside[0].name
            return f"intermediate '{v.name}' is also used by {who}"
    return None


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, plan):
        super().__init__(mod)
        self.plan = plan

    def visit_var_binding_(self, binding):
        m = self.plan.get(binding.var)
        if m is None:
            super().visit_var_binding_(binding)
            return
        m._remap = self.visit_expr
        new_value = m.rule.rewrite(m, self.builder_)
        new_value = self.builder_.normalize(new_value)
        old_ty, new_ty = binding.var.ty, new_value.ty
        if not tvm_ffi.structural_equal(old_ty, new_ty):
            raise RuntimeError(f"{m.rule.name} rewrote '{binding.var.name}' from {old_ty} to {new_ty} "
                               "(a rule must preserve the type of what it replaces)")
        if isinstance(binding.var, relax.DataflowVar) and isinstance(new_value, relax.Var):
            new_var = new_value  # the rewrite is an existing value (x*1 → x): no alias binding
        elif isinstance(binding.var, relax.DataflowVar):
            new_var = self.builder_.emit(new_value, name_hint=binding.var.name)
        else:
            new_var = self.builder_.emit_output(new_value, name_hint=binding.var.name)
        self.set_var_remap(binding.var, new_var)  # 0.27: keyed by the Var itself
        record_applied(FusionEvent(m.rule.name, m.rule.kind, m.func_name, binding.var.name, m.rule.describe(m)))


def apply_rules(mod: tvm.IRModule, rules: List[FusionRule]) -> tvm.IRModule:
    """Run ``rules`` over every Relax function of ``mod``; returns ``mod`` itself when nothing fired."""
    plans = {}
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and not _is_composite(func):
            plan = _plan(func, gv.name_hint, rules)
            if plan:
                plans[gv] = plan
    if not plans:
        return mod
    mod = mod.clone()  # the builder below adds to and updates its module: never the caller's
    for gv, plan in plans.items():
        rw = _Rewriter(mod, plan)
        new_func = rw.visit_expr(mod[gv])
        new_func = relax.analysis.remove_all_unused(new_func)
        mod = rw.builder_.get()
        mod[gv] = new_func
    return mod


def _is_composite(func) -> bool:
    return func.attrs is not None and ("Composite" in func.attrs or "Primitive" in func.attrs)


def rule_pass(name: str, rules: List[FusionRule]) -> tvm.transform.Pass:
    """Wrap rules as a module pass usable in any Relax pipeline."""

    def _transform(mod, _ctx):
        return apply_rules(mod, rules)

    return tvm.transform.module_pass(_transform, opt_level=0, name=name)
