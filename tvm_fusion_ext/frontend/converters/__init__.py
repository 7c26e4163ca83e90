"""The converter table: TVM's ONNX converter map with this package's fixed converters laid over it.

Found by running every single-operator case of ONNX's backend tests through ``tvm-fusion run``
(``tests/robustness/node_sweep.py``; docs/coverage.md, "Operator coverage"). The remedy is never a patch to TVM:
each family module subclasses TVM's converters where they compute something else, or refuse (raise
:class:`..errors.Unsupported`) where they would silently substitute a default. Each family module's
``converters()`` builds its classes on first use (so importing the front end does not import TVM), and
:func:`convert_map` assembles them, once, into the one table the importer reads:

* :mod:`.arith`: elementwise arithmetic and comparisons, Einsum, unary ops folded on constants;
* :mod:`.reductions`: ReduceMax/ReduceMin of infinities, TopK;
* :mod:`.shape`: Constant, ConstantOfShape/Expand/Range/Concat of sizes, Gather/ScatterND/Tile/OneHot, size inputs
  folded to constants; :mod:`.reshape`, :mod:`.slice`, :mod:`.pad`: those ops read against the input ranges;
* :mod:`.normalization`: LayerNormalization, RMSNormalization, Dropout;
* :mod:`.attention`, :mod:`.rotary`: ONNX's own Attention and RotaryEmbedding;
* :mod:`.signal`: DFT; :mod:`.quantization`: QuantizeLinear; :mod:`.vision`: Resize, SpaceToDepth,
  NonMaxSuppression; :mod:`.control_flow`: ``If`` nodes decided at import.

Binary converters are wrapped last (:class:`.common.LiftedScalars`) so that a size kept as a bare scalar meets a
tensor as a tensor.
"""

from __future__ import annotations

from typing import Any, Dict

from . import arith, normalization, quantization, reductions, reshape, rotary, shape, signal, vision
from .common import LiftedScalars

#: the families whose ``converters()`` lay over TVM's map, in no particular order (an op belongs to one family)
FAMILIES = (arith, reductions, shape, reshape, normalization, rotary, signal, quantization, vision)

_TABLE: Dict[str, Any] = {}


def convert_map() -> Dict[str, Any]:
    """``{op name: converter}``: TVM's map with every family's converters over it (built once, on first use)."""
    if not _TABLE:
        _TABLE.update(_assemble())
    return dict(_TABLE)


def _assemble() -> Dict[str, Any]:
    from tvm.relax.frontend.onnx import onnx_frontend

    table = dict(onnx_frontend._get_convert_map())
    owner: Dict[str, str] = {}
    for family in FAMILIES:
        for op, converter in family.converters().items():
            if op in owner:  # two fixes for one op: the table would keep whichever came last
                raise RuntimeError(f"converter for {op!r} defined by both {owner[op]} and {family.__name__}")
            owner[op] = family.__name__
            table[op] = converter
    for op, converter in table.items():
        if isinstance(converter, type) and issubclass(converter, onnx_frontend.BinaryBase):
            table[op] = LiftedScalars(converter, op)
    return table


__all__ = ["FAMILIES", "convert_map"]
