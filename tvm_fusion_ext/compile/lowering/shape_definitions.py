"""Symbolic dims defined before the fused groups that use them."""

from __future__ import annotations

import tvm
from tvm import relax


def ShapeDefinitionsFirst() -> tvm.transform.Pass:  # noqa: N802
    """Move each ``match_cast`` that defines a symbolic dim, with what it needs, ahead of the other bindings.

    ``FuseOps`` emits a fused group where its first member was. A data-dependent length (``Range`` to a computed
    bound: the importer's ``range_len_0``) is defined by a ``match_cast`` in the middle of the block; an
    elementwise chain that starts before it and ends in ops over ``[range_len_0]`` then became one group emitted
    before the length exists, and the VM build failed ("range_len_0 has not been computed"; ONNX's window
    functions). With the definitions first, every group starts after them."""

    @tvm.transform.module_pass(opt_level=0, name="tfx.ShapeDefinitionsFirst")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        out = None
        for gv, func in list(mod.functions_items()):
            if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
                known = {v for p in func.params for v in relax.analysis.definable_tir_vars_in_type(p.ty)}
                blocks = [_definitions_first(b, known) for b in func.body.blocks]
                if any(not new.same_as(old) for new, old in zip(blocks, func.body.blocks)):
                    body = relax.SeqExpr(blocks, func.body.body)
                    out = out if out is not None else mod.clone()
                    out[gv] = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)
        return out if out is not None else mod

    return _pass


def _definitions_first(block, known):
    """``block`` with the ``match_cast`` bindings that define a dim not in ``known`` (the parameters' dims) moved
    ahead, each after what it reads; unchanged when they are already a prefix."""
    if not isinstance(block, relax.DataflowBlock):
        return block
    bindings = list(block.bindings)
    index = {b.var: i for i, b in enumerate(bindings)}
    defining = [i for i, b in enumerate(bindings) if isinstance(b, relax.MatchCast)
                and any(v not in known for v in relax.analysis.definable_tir_vars_in_type(b.ty))]
    if not defining:
        return block
    first, seen = [], set()

    def need(i):  # the binding and, before it, every binding of this block it reads
        if i in seen:
            return
        seen.add(i)
        for v in relax.analysis.free_vars(bindings[i].value):
            if v in index:
                need(index[v])
        first.append(i)

    for i in defining:
        need(i)
    if first == list(range(len(first))):
        return block
    order = first + [i for i in range(len(bindings)) if i not in seen]
    return relax.DataflowBlock([bindings[i] for i in order], block.span)
