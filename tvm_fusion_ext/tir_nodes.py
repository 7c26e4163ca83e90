"""Walking TIR in Python on TVM 0.27, which has no ``tirx.stmt_functor``: a structural map that rebuilds nothing
visits nodes of one type, and one that swaps variables substitutes."""

from __future__ import annotations

from typing import Dict, List

import tvm_ffi
from tvm import tirx


def collect(node, node_type) -> List:
    """Every node of ``node_type`` inside ``node`` (post-order)."""
    found = []

    def visit(n):
        found.append(n)
        return n

    tvm_ffi.structural_map(node, (node_type, visit))
    return found


def substitute(node, binding: Dict):
    """``node`` with each variable in ``binding`` replaced by its value."""
    if not binding:
        return node
    return tvm_ffi.structural_map(node, (tirx.Var, lambda v: binding.get(v, v)))
