"""``einsum((a, b), eq)`` that is a matrix product → ``permute_dims`` + ``matmul`` (+ ``permute_dims``).

Some models write attention and projections as einsum: ProphetNet's scores and context as
``bsij,bsjk->bsik``, others ``bhqd,bhkd->bhqk`` (k read transposed) or ``bsd,df->bsf``. They are the same
products the fusion rules read as ``matmul`` with a head split around it; as einsum they match nothing, and the
attention stays unfused with its S×T scores. The equation says what each axis is, so the product is rewritten
as the matmul it means, with the permutes that put its axes where matmul wants them; the attention matcher then
reads those permutes as it reads any head split.

Pattern
    ``einsum((a, b), eq)``: two operands.
Check (a reason names what is not a matrix product)
    no ellipsis, no letter twice in one term (a diagonal); the letters are: batch (in a, b and the output, with
    equal extents: einsum does not broadcast them), one contracted letter (in a and b, not the output),
    one right-free letter (b and the output), one or more left-free letters (a and the output; several only
    without batch letters, where matmul's broadcasting reads them as a's batch). A letter summed away within
    one operand is another reduction.
Rewrite
    ``a`` permuted to ``[batch, left, contracted]``, ``b`` to ``[batch, contracted, right]``, their matmul
    permuted to the output's order (each permute only where it is not the identity).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import tvm_ffi
from tvm import relax

from ..graph import FunctionGraph, op_name, same_dim, same_dims, shape_dims
from ..rule import Found, FusionRule, Match, Matcher, Variant


class _Product:
    """The letters of a two-operand einsum, sorted into a matrix product's roles."""

    def __init__(self, a: str, b: str, out: str):
        self.a, self.b, self.out = a, b, out
        self.batch = [c for c in out if c in a and c in b]
        self.contracted = [c for c in a if c in b and c not in out]
        self.left = [c for c in out if c in a and c not in b]
        self.right = [c for c in out if c in b and c not in a]
        self.summed = [c for c in a + b if c not in out and not (c in a and c in b)]


def parse_product(subscripts: str) -> Tuple[Optional[_Product], Optional[str]]:
    """``(product, None)`` for an equation that is a matrix product, else ``(None, why not)``."""
    eq = subscripts.replace(" ", "")
    if "->" not in eq or "." in eq:
        return None, f"einsum '{subscripts}' has no explicit output or has an ellipsis"
    ins, out = eq.split("->")
    terms = ins.split(",")
    if len(terms) != 2:
        return None, f"einsum '{subscripts}' has {len(terms)} operands"
    a, b = terms
    for term in (a, b, out):
        if len(set(term)) != len(term):
            return None, f"einsum '{subscripts}' repeats a letter in '{term}' (a diagonal)"
    p = _Product(a, b, out)
    if p.summed:
        return None, f"einsum '{subscripts}' sums '{''.join(p.summed)}' within one operand"
    if len(p.contracted) != 1:
        return None, f"einsum '{subscripts}' contracts {len(p.contracted)} letters, not one"
    if len(p.right) != 1 or not p.left:
        return None, f"einsum '{subscripts}' is not [.., m, k] x [.., k, n] (free letters '{''.join(p.left)}', " \
                     f"'{''.join(p.right)}')"
    if len(p.left) > 1 and p.batch:
        return None, f"einsum '{subscripts}' has batch letters and several free letters of the left operand"
    return p, None


def _permuted(bb: relax.BlockBuilder, x: relax.Expr, have: str, want: List[str]) -> relax.Expr:
    perm = [have.index(c) for c in want]
    return x if perm == list(range(len(perm))) else bb.emit(relax.op.permute_dims(x, perm))


class _EinsumMatcher(Matcher):
    def match(self, root: relax.Var, graph: FunctionGraph) -> Optional[Found]:
        value = graph.var2val[root]
        if op_name(value) != "relax.einsum":
            return None
        operands = graph.value(value.args[0])
        if not isinstance(operands, relax.Tuple) or len(operands.fields) != 2:
            return None
        return Found({"a": operands.fields[0], "b": operands.fields[1], "einsum": value})


class EinsumAsMatmul(FusionRule):
    name = "EinsumAsMatmul"
    kind = "canonical"

    def variants(self) -> List[Variant]:
        return [Variant(_EinsumMatcher(), root_op="relax.einsum")]

    def check(self, m: Match) -> Optional[str]:
        product, why = parse_product(str(m["einsum"].attrs.subscripts))
        if product is None:
            return why
        a, b = shape_dims(m["a"]), shape_dims(m["b"])
        if a is None or b is None:
            return "einsum operand shapes are unknown (rank only)"
        for c in product.batch + product.contracted:
            if not same_dim(a[product.a.index(c)], b[product.b.index(c)]):
                return f"einsum letter '{c}' has extents {a[product.a.index(c)]} and {b[product.b.index(c)]}"
        return None

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        p, _ = parse_product(str(m["einsum"].attrs.subscripts))
        (k,) = p.contracted
        a = _permuted(bb, m.arg("a"), p.a, p.batch + p.left + [k])
        b = _permuted(bb, m.arg("b"), p.b, p.batch + [k] + p.right)
        product = relax.op.matmul(a, b)
        got = "".join(p.batch + p.left + p.right)
        out = product if got == p.out else relax.op.permute_dims(bb.emit(product), [got.index(c) for c in p.out])
        # Relax's einsum may type a dim as an expression equal to, but not written like, the matmul's (Pegasus-X's
        # dynamic export: ``max(seq // 4 + 1, seq // 4 + 1)``); the engine wants the type kept exactly, so the
        # result is viewed in the einsum's own shape (a reshape to the same sizes moves nothing)
        out = bb.normalize(out)
        old = m.root_var.ty
        if not tvm_ffi.structural_equal(out.ty, old) and same_dims(shape_dims(out), shape_dims(m.root_var)):
            return relax.op.reshape(bb.emit(out), old.shape)
        return out
