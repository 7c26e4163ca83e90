"""The engine's own guarantees, shown with a toy multi-root rule written as a :class:`Matcher`.

``SiblingAdds`` takes every ``add(x, ·)`` of one ``x`` in a block and computes them all where the first one
was (a stand-in for QKV-like horizontal rules). What is checked is the engine's part: where the replacement
is built and each root bound, the placement check, claiming against other matches, type preservation per
root, reporting, identity and not touching the caller's module.
"""

import numpy as np
import pytest
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from tvm_fusion_ext.testing import assert_refused, build_module, fuse, random_inputs, run_before_after
from tvm_fusion_ext.transform import Found, FusionRule, Matcher, Variant, rule_pass
from tvm_fusion_ext.transform.graph import op_name


class SiblingAdds(Matcher):
    def match(self, root, graph):
        x = graph.var2val[root].args[0]
        siblings = sorted((u for u in graph.users(x) if u is not None and _is_add_of(graph.var2val.get(u), x)),
                          key=graph.position.get)  # in binding order: the first is where the match is found
        if len(siblings) < 2 or not root.same_as(siblings[0]):
            return None
        others = relax.Tuple([graph.var2val[s].args[1] for s in siblings])
        return Found({"x": x, "others": others}, roots=siblings)


def _is_add_of(value, x):
    return op_name(value) == "relax.add" and value.args[0].same_as(x)


class SiblingAddsRule(FusionRule):
    name = "SiblingAdds"
    kind = "canonical"

    def variants(self):
        return [Variant(SiblingAdds(), root_op="relax.add")]

    def rewrite(self, m, bb):
        return [bb.emit(relax.op.add(m.arg("x"), m.remap(o))) for o in m["others"].fields]

    def describe(self, m):
        return f"{len(m.roots)} adds"


class SwapAddOperands(FusionRule):
    """A single-root dpl rule competing for the same bindings."""

    name = "SwapAddOperands"
    kind = "canonical"

    def variants(self):
        x, y = wildcard(), wildcard()
        return [Variant(is_op("relax.add")(x, y), {"x": x, "y": y}, root_op="relax.add")]

    def rewrite(self, m, bb):
        return relax.op.add(m.arg("y"), m.arg("x"))


def _vars(*names, shape=(2, 3)):
    return [relax.Var(n, relax.TensorType(shape, "float32")) for n in names]


def _siblings_module(b_after_first=False):
    """``s1 = x + a; t = s1 * s1; s2 = x + b`` (with ``b = a * a`` computed after ``s1`` when asked)."""
    x, a, b = _vars("x", "a", "b")

    def build(bb):
        s1 = bb.emit(relax.op.add(x, a), name_hint="s1")
        t = bb.emit(relax.op.multiply(s1, s1), name_hint="t")
        other = bb.emit(relax.op.multiply(a, a), name_hint="a2") if b_after_first else b
        s2 = bb.emit(relax.op.add(x, other), name_hint="s2")
        return relax.Tuple([t, s2])

    return build_module([x, a, b], build)


def _ops(mod):
    return [bd.value.op.name for blk in mod["main"].body.blocks for bd in blk.bindings
            if isinstance(bd.value, relax.Call)]


def test_multi_root_replacement_is_built_at_the_first_binding():
    mod = _siblings_module()
    snapshot = mod.script()
    fused, report = fuse(mod, SiblingAddsRule())
    assert report.count("SiblingAdds") == 1
    assert [(e.at, e.detail) for e in report.applied] == [("s1", "2 adds")]
    assert _ops(fused) == ["relax.add", "relax.add", "relax.multiply"]  # s2 is now computed before t
    assert mod.script() == snapshot  # the caller's module is untouched
    inputs = random_inputs(mod, seed=0)
    for expected, actual in zip(*run_before_after(mod, fused, inputs)):
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


def test_input_computed_after_the_first_binding_is_refused():
    assert_refused(_siblings_module(b_after_first=True), SiblingAddsRule(),
                   reason="'a2' is computed after 's1', where the fused value would be built")


def test_multi_root_match_does_not_take_claimed_bindings():
    # the walk goes backwards: s2 is taken by the single-root rule before the multi-root match is found at s1
    step = rule_pass("both", [SiblingAddsRule(), SwapAddOperands()])
    _, report = fuse(_siblings_module(), step)
    assert report.count("SiblingAdds") == 0
    assert report.count("SwapAddOperands") == 2


class _WrongPieces(SiblingAddsRule):
    def __init__(self, rewrite):
        self._rewrite = rewrite

    def rewrite(self, m, bb):
        return self._rewrite(m, bb)


def test_each_root_keeps_its_type():
    rule = _WrongPieces(lambda m, bb: [m.arg("x"), relax.op.sum(m.arg("x"))])
    with pytest.raises(RuntimeError, match="rewrote 's2' from"):
        fuse(_siblings_module(), rule)


def test_one_replacement_per_root():
    rule = _WrongPieces(lambda m, bb: [m.arg("x")])
    with pytest.raises(RuntimeError, match=r"built 1 replacement\(s\) for 2 root\(s\)"):
        fuse(_siblings_module(), rule)


def test_nothing_to_do_returns_the_input():
    x, a = _vars("x", "a")
    mod = build_module([x, a], lambda bb: relax.op.add(x, a))
    fused, report = fuse(mod, SiblingAddsRule())
    assert fused.same_as(mod)
    assert report.applied == [] and report.refused == []
