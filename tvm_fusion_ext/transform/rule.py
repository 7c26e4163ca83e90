"""The fusion engine: every rule says what to look for, whether it is safe and what to put in its place.

A rule (:class:`FusionRule`) gives its pattern spellings (``variants``), a ``check`` that returns ``None`` to
accept a structural match or a one-line reason to refuse it, and a ``rewrite`` that builds the replacement.
The engine (:func:`apply_rules`) owns everything rules must not get wrong individually:

* greedy matching from the end of each dataflow block backwards, so the largest pattern anchored at the most
  downstream binding wins (``matmul+add+gelu`` before ``matmul+add``);
* claiming: a binding taken by one accepted match is never part of another;
* the leak check: an intermediate of the match used outside it refuses the match (rewriting would compute it
  twice or change what the other user sees);
* type preservation: each replaced binding keeps exactly its type;
* reporting: accepted and refused matches go to every active :class:`FusionReport`;
* identity: a pass that fires nowhere returns its input module unchanged (same object), and the caller's
  module is never changed in place.

The matcher protocol
    A variant's matcher answers one question for the engine: does a match start at this binding, and if so,
    which bindings does it take over? Two kinds answer it.

    * A dpl ``DFPattern`` is a matcher as it is. The engine calls ``extract_matched_expr(value, var2val)``,
      gives the rule the sub-matches named in ``Variant.names`` (a wildcard bound to a variable is the
      variable: it is an input of the match), and counts every other matched call as *covered*.
    * A :class:`Matcher` subclass is written as code, for what a dpl pattern cannot say: attention is found
      by walking the graph by meaning, QKV is several bindings at once. Its ``match(root, graph)`` returns a
      :class:`Found` that says it all: the named expressions (and any facts) the rule reads back with
      ``m[name]``, the bindings it covers, and, for a multi-root match, its roots.

Roots
    A match replaces its *roots*; by default that is the one binding it was found at. A multi-root match
    (QKV: each projection becomes a piece of one split) lists them, and its rewrite returns one expression
    per root. A single-root replacement is built where its root was; a multi-root one where the match's
    first binding was (so every input the rewrite reads must exist by then: checked, else refused), and each
    root is then bound to its piece where it stood. Covered bindings are left for dead-code removal.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Collection, Dict, List, Mapping, Optional, Sequence, Set, Union

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import DFPattern, WildcardPattern

from .graph import FunctionGraph, const_value, op_name, scalar_value, shape_dims, static_shape
from .report import ExpectedRefusal, FusionEvent, record_applied, record_refused


# ---------------------------------------------------------------------------------------------------
# matchers
# ---------------------------------------------------------------------------------------------------

@dataclass
class Found:
    """What a matcher reports about one match."""

    #: rule-facing name -> matched expression, or any fact the matcher worked out for the rule
    exprs: Mapping[str, Any]
    #: bindings the match absorbs besides its roots: the intermediates of the leak check
    covered: Collection[relax.Var] = ()
    #: bindings the rewrite replaces, one expression each; empty means "the binding the match was found at"
    roots: Sequence[relax.Var] = ()


class Matcher(abc.ABC):
    """A pattern written as code (see "The matcher protocol" above)."""

    @abc.abstractmethod
    def match(self, root: relax.Var, graph: FunctionGraph) -> Optional[Found]:
        """The match found at binding ``root`` of ``graph``, or None."""


class PatternMatcher(Matcher):
    """A dpl pattern seen through the protocol; the engine wraps every ``Variant`` whose root is a DFPattern."""

    def __init__(self, pattern: DFPattern, names: Mapping[str, DFPattern]):
        self.pattern = pattern
        self.names = names

    def match(self, root: relax.Var, graph: FunctionGraph) -> Optional[Found]:
        matched = self.pattern.extract_matched_expr(graph.var2val[root], graph.var2val)
        if matched is None:
            return None
        exprs = {}
        for name, pat in self.names.items():
            if pat in matched:
                e = matched[pat]
                if isinstance(pat, WildcardPattern):
                    # dpl records a wildcard bound to a variable as the variable's *value*; an input is the variable
                    var = graph.var_of(e)
                    e = e if var is None else var
                exprs[name] = e
        covered = set()
        for pat, e in matched.items():
            if isinstance(pat, WildcardPattern) or not isinstance(e, (relax.Call, relax.Tuple, relax.TupleGetItem)):
                continue  # wildcards are the match's inputs
            var = graph.var_of(e)
            if var is not None:
                covered.add(var)
        covered.discard(root)
        return Found(exprs, covered)


@dataclass
class Variant:
    """One spelling of a rule's pattern: a dpl pattern (with the sub-patterns the rule wants by name) or a
    :class:`Matcher`."""

    root: Union[DFPattern, Matcher]
    names: Dict[str, DFPattern] = field(default_factory=dict)
    tag: dict = field(default_factory=dict)  # free-form facts about this spelling (e.g. {"act": "gelu"})
    #: the operator of the binding a match is found at ("relax.matmul"), when fixed: lets the engine skip
    #: the matcher cheaply
    root_op: Optional[str] = None

    def __post_init__(self):
        self.matcher = self.root if isinstance(self.root, Matcher) else PatternMatcher(self.root, self.names)


class Match:
    """One match of one variant, found at binding ``root_var`` of the original function.

    Reading (original graph): ``m[name]``, ``m.has``, ``m.value``, ``m.const``, ``m.scalar``, ``m.shape``,
    ``m.dims``, ``m.dtype``, and ``m.lookup`` / ``m.graph`` for any other expression. Building (inside
    ``rewrite``): ``m.arg(name)`` and ``m.remap(expr)`` give expressions as they exist in the function being
    rebuilt.
    """

    def __init__(self, rule: "FusionRule", variant: Variant, func_name: str, root_var: relax.Var, found: Found,
                 graph: FunctionGraph):
        self.rule = rule
        self.variant = variant
        self.tag = variant.tag
        self.func_name = func_name
        self.root_var = root_var
        self.graph = graph
        #: the bindings the rewrite replaces, in the order its expressions come in
        self.roots: List[relax.Var] = list(found.roots) or [root_var]
        self.multi_root = bool(found.roots)
        self.covered: Set[relax.Var] = set(found.covered) - set(self.roots)
        #: every binding the match takes over (roots, covered, and the one it was found at)
        self.bindings: Set[relax.Var] = self.covered | set(self.roots) | {root_var}
        self._exprs = found.exprs
        self._remap = None  # set by the engine while it rebuilds the function

    # -- reading the match (original graph) ---------------------------------------------------------
    def has(self, name: str) -> bool:
        return name in self._exprs

    def __getitem__(self, name: str):
        return self._exprs[name]

    def lookup(self, expr: relax.Expr) -> relax.Expr:
        """Any expression of the original graph with variable bindings looked through to its value."""
        return self.graph.value(expr)

    @property
    def root_value(self) -> relax.Expr:
        return self.graph.var2val[self.root_var]

    def value(self, name: str) -> relax.Expr:
        """The matched expression with variable bindings looked through."""
        return self.lookup(self[name])

    def const(self, name: str):
        return const_value(self.value(name))

    def scalar(self, name: str) -> Optional[float]:
        return scalar_value(self.value(name))

    def shape(self, name: str) -> Optional[List[int]]:
        return static_shape(self[name])

    def dims(self, name: str):
        """The shape with symbolic dimensions kept as ``PrimExpr`` (see :func:`graph.shape_dims`)."""
        return shape_dims(self[name])

    def dtype(self, name: str) -> str:
        return str(self[name].ty.dtype)

    # -- building the replacement -------------------------------------------------------------------
    def arg(self, name: str) -> relax.Expr:
        """The matched input as it exists in the function being rebuilt (use inside ``rewrite``)."""
        return self._remap(self[name])

    def remap(self, expr: relax.Expr) -> relax.Expr:
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

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> Union[relax.Expr, Sequence[relax.Expr]]:
        """The replacement of ``m.root_var``'s value, built from ``m.arg(...)`` inputs; for a multi-root
        match, one expression per root, in the order of ``m.roots``."""
        raise NotImplementedError

    def describe(self, m: Match) -> str:
        """Short text for the report's accepted entry (what exactly was fused)."""
        return ", ".join(f"{k}={v}" for k, v in m.tag.items())

    def cached_variants(self) -> List[Variant]:
        if not hasattr(self, "_variant_cache"):
            self._variant_cache = list(self.variants())
        return self._variant_cache


# ---------------------------------------------------------------------------------------------------
# planning: which matches are accepted
# ---------------------------------------------------------------------------------------------------

def _plan(graph: FunctionGraph, func_name: str, rules: List[FusionRule]) -> Dict[relax.Var, Match]:
    """Accepted matches by the binding where their replacement is built."""
    plan: Dict[relax.Var, Match] = {}
    claimed: Set[relax.Var] = set()
    # bindings inside an already-refused match: the same rule's smaller matches there are the same near
    # miss seen again, so they are not reported twice (they may still be accepted)
    refusal_cover: Dict[relax.Var, set] = {}
    for block in reversed(list(graph.func.body.blocks)):
        if not isinstance(block, relax.DataflowBlock):
            continue
        for binding in reversed(list(block.bindings)):
            if not isinstance(binding, relax.VarBinding) or binding.var in claimed:
                continue
            accepted, refusal = _first_accepted(graph, func_name, rules, binding, claimed)
            if accepted is not None:
                plan[_anchor(accepted, graph)] = accepted
                claimed |= accepted.bindings
            elif refusal is not None:
                m, reason = refusal
                for v in m.covered:
                    refusal_cover.setdefault(v, set()).add(m.rule.name)
                if m.rule.name not in refusal_cover.get(binding.var, ()):
                    record_refused(FusionEvent(m.rule.name, m.rule.kind, func_name, binding.var.name, reason,
                                               expected=isinstance(reason, ExpectedRefusal)))
    return plan


def _first_accepted(graph, func_name, rules, binding, claimed):
    """(the first accepted match at ``binding``, None) or (None, the first refused one with its reason)."""
    refusal = None
    root_op = op_name(binding.value)
    for rule in rules:
        for variant in rule.cached_variants():
            if variant.root_op is not None and variant.root_op != root_op:
                continue
            found = variant.matcher.match(binding.var, graph)
            if found is None:
                continue
            m = Match(rule, variant, func_name, binding.var, found, graph)
            if m.bindings & claimed:
                continue  # a multi-root match reaching into bindings another match already took
            reason = _placement_error(m, graph) or _leak(m, graph) or rule.check(m)
            if reason is None:
                return m, None
            if refusal is None:
                refusal = (m, reason)
    return None, refusal


def _anchor(m: Match, graph: FunctionGraph) -> relax.Var:
    """Where the replacement is built: the root, or a multi-root match's first binding."""
    if not m.multi_root:
        return m.root_var
    return min(m.bindings, key=lambda v: graph.position[v])


def _placement_error(m: Match, graph: FunctionGraph) -> Optional[str]:
    """A multi-root replacement is built at the match's first binding: what it reads must exist there."""
    if not m.multi_root:
        return None
    taken = m.bindings
    if any(v not in graph.position for v in taken):
        return "the match takes over something that is not a binding of this function"
    blocks = {graph.position[v][0] for v in taken}
    if len(blocks) != 1:
        return "the match spans several dataflow blocks"
    anchor = _anchor(m, graph)
    for e in m._exprs.values():
        if not isinstance(e, relax.Expr):
            continue  # a fact the matcher worked out, not part of the graph
        for v in relax.analysis.free_vars(e):
            if v not in taken and v in graph.position and graph.position[v] >= graph.position[anchor]:
                return f"'{v.name}' is computed after '{anchor.name}', where the fused value would be built"
    return None


def _leak(m: Match, graph: FunctionGraph) -> Optional[str]:
    allowed = m.bindings
    for v in sorted(m.covered, key=graph.position.get):
        outside = [u for u in graph.users(v) if u not in allowed]
        if outside:
            who = "the function result" if None in outside else min(outside, key=graph.position.get).name
            return f"intermediate '{v.name}' is also used by {who}"
    return None


# ---------------------------------------------------------------------------------------------------
# rewriting
# ---------------------------------------------------------------------------------------------------

@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, plan: Dict[relax.Var, Match]):
        super().__init__(mod)
        self.plan = plan
        self.pieces: Dict[relax.Var, relax.Expr] = {}  # root -> its replacement, built at the match's anchor

    def visit_var_binding_(self, binding):
        m = self.plan.get(binding.var)
        if m is not None:
            self._build(m, binding.var)
        piece = self.pieces.pop(binding.var, None)
        if piece is None:
            super().visit_var_binding_(binding)
            return
        var = binding.var
        if isinstance(var, relax.DataflowVar) and isinstance(piece, relax.Var):
            new_var = piece  # the rewrite is an existing value (x*1 → x): no alias binding
        elif isinstance(var, relax.DataflowVar):
            new_var = self.builder_.emit(piece, name_hint=var.name)
        else:
            new_var = self.builder_.emit_output(piece, name_hint=var.name)
        self.set_var_remap(var, new_var)  # 0.27: keyed by the Var itself

    def _build(self, m: Match, anchor: relax.Var):
        m._remap = self.visit_expr
        out = m.rule.rewrite(m, self.builder_)
        values = [out] if isinstance(out, relax.Expr) else list(out)
        if len(values) != len(m.roots):
            raise RuntimeError(f"{m.rule.name} built {len(values)} replacement(s) for {len(m.roots)} root(s) "
                               f"at '{anchor.name}'")
        for root, value in zip(m.roots, values):
            value = self.builder_.normalize(value)
            old_ty, new_ty = root.ty, value.ty
            if not tvm_ffi.structural_equal(old_ty, new_ty):
                raise RuntimeError(f"{m.rule.name} rewrote '{root.name}' from {old_ty} to {new_ty} "
                                   "(a rule must preserve the type of what it replaces)")
            self.pieces[root] = value
        record_applied(FusionEvent(m.rule.name, m.rule.kind, m.func_name, anchor.name, m.rule.describe(m)))


def apply_rules(mod: tvm.IRModule, rules: List[FusionRule]) -> tvm.IRModule:
    """Run ``rules`` over every Relax function of ``mod``; returns ``mod`` itself when nothing fired."""
    plans = {}
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and not _is_composite(func):
            plan = _plan(FunctionGraph(func, mod), gv.name_hint, rules)
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
