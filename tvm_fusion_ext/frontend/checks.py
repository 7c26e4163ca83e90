"""Refusals before importing: what TVM's importer would convert wrongly or crash on, named by op, node and reason.

* :func:`check_ops`: ops no converter takes (TVM's map, ours, ONNX Runtime's contrib ops), the first one named with
  a count of the others;
* :func:`check_graph`: combinations refused: element types TVM cannot compute with or numpy cannot hold,
  training-mode semantics, attributes TVM ignores, ops of other domains that share a name with one TVM converts
  (TVM's map is keyed by name alone; ONNX's own ``Attention``, whose name TVM's ``com.microsoft.Attention``
  converter takes, is converted by :mod:`.converters.attention`; ONNX Runtime's ``com.microsoft`` ops themselves
  by :mod:`.ort_contrib`).
"""

from __future__ import annotations

from typing import Callable, Dict, Iterator, Optional

import numpy as np

from .errors import ModelLoadError
from .ort_contrib import MICROSOFT_OPS as ORT_CONTRIB_OPS
from .ort_contrib import ONNX_DOMAIN_OPS as ORT_ONNX_DOMAIN_OPS
from .ort_contrib import is_contrib
from .ort_contrib import unsupported_reason as ort_unsupported_reason

#: ONNX element types TVM cannot compute with (or, for bfloat16 at a graph boundary, numpy cannot hold)
NO_COMPUTE_TYPES = frozenset({"FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT8E8M0",
                              "FLOAT4E2M1", "UINT4", "INT4", "UINT2", "INT2", "STRING", "COMPLEX64",
                              "COMPLEX128", "UNDEFINED"})
NO_NUMPY_TYPES = NO_COMPUTE_TYPES | {"BFLOAT16"}

#: ONNX Runtime's ``com.microsoft`` ops that import: ours (:mod:`.ort_contrib`), and TVM's ``MatMulInteger16``
MICROSOFT_OPS = ORT_CONTRIB_OPS | {"MatMulInteger16"}
_DEFAULT_DOMAINS = ("", "ai.onnx")

#: how a refusal of training-mode semantics says to export instead (torch exports a module not put in eval mode
#: with Dropout's and BatchNormalization's training forms)
EXPORT_FOR_INFERENCE = ("export the model in eval mode (model.eval()) or with "
                        "torch.onnx.export(..., training=torch.onnx.TrainingMode.EVAL)")


class _GraphFacts:
    """What the checks need to know about a graph: declared element types and constant values by name."""

    def __init__(self, graph):
        from onnx import TensorProto, numpy_helper

        self.types: Dict[str, str] = {}
        self.constants: Dict[str, np.ndarray] = {}
        for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
            if vi.type.HasField("tensor_type"):
                self.types[vi.name] = TensorProto.DataType.Name(vi.type.tensor_type.elem_type)
        for init in graph.initializer:
            self.types[init.name] = TensorProto.DataType.Name(init.data_type)
            if init.data_type != TensorProto.STRING and not init.external_data:
                self.constants[init.name] = numpy_helper.to_array(init)
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in _DEFAULT_DOMAINS and node.output:
                value = next((a.t for a in node.attribute if a.name == "value"), None)
                if value is not None and value.data_type != TensorProto.STRING:
                    self.constants[node.output[0]] = numpy_helper.to_array(value)


def _attr(node, name: str, default=None):
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _input(node, i: int) -> Optional[str]:
    return node.input[i] if len(node.input) > i and node.input[i] else None


def _type_name(code: int) -> str:
    from onnx import TensorProto

    return TensorProto.DataType.Name(code)


def _cast_refusal(node, facts: _GraphFacts) -> Optional[str]:
    target = _type_name(_attr(node, "to", 0)) if node.op_type == "Cast" else facts.types.get(_input(node, 1) or "")
    if target in NO_COMPUTE_TYPES:
        return f"casting to {target} is not supported (TVM has no correct conversion to that type)"
    return None


def _batchnorm_refusal(node, facts) -> Optional[str]:
    if _attr(node, "training_mode", 0):
        return f"training_mode=1 (batch statistics and running-mean updates) is not supported; {EXPORT_FOR_INFERENCE}"
    return None


def _dropout_refusal(node, facts) -> Optional[str]:
    mode = _input(node, 2)
    if mode is None:
        return None
    value = facts.constants.get(mode)
    if value is None:
        return (f"training_mode input {mode!r} is computed at run time; only inference (training_mode false) is "
                f"supported: {EXPORT_FOR_INFERENCE}")
    if bool(np.asarray(value).reshape(-1)[0]):
        return f"training_mode=true (random dropout) is not supported; {EXPORT_FOR_INFERENCE}"
    return None


def _conv_transpose_refusal(node, facts) -> Optional[str]:
    if _attr(node, "output_shape") is not None:
        return "the output_shape attribute is not supported (TVM's converter ignores it); give pads instead"
    return None


def _roi_align_refusal(node, facts) -> Optional[str]:
    mode = _attr(node, "mode", b"avg")
    if (mode.decode() if isinstance(mode, bytes) else mode) == "max":
        return "mode='max' is not supported (TVM pools the sampled values differently from ONNX)"
    return None


def _constant_refusal(node, facts) -> Optional[str]:
    from onnx import TensorProto

    names = {a.name for a in node.attribute}
    if names & {"value_string", "value_strings"}:
        return "string constants are not supported"
    if "sparse_value" in names:
        return "sparse constants are not supported"
    value = _attr(node, "value")
    if value is not None and value.data_type == TensorProto.STRING:
        return "string constants are not supported"
    return None


#: op type (default domain) -> check returning the reason a node is refused, or None
_CHECKS: Dict[str, Callable] = {
    "Cast": _cast_refusal,
    "CastLike": _cast_refusal,
    "BatchNormalization": _batchnorm_refusal,
    "Dropout": _dropout_refusal,
    "ConvTranspose": _conv_transpose_refusal,
    "RoiAlign": _roi_align_refusal,
    "Constant": _constant_refusal,
}


def iter_nodes(graph) -> Iterator:
    """Every node of ``graph`` and of its subgraphs (If/Loop/Scan bodies), depth first."""
    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.HasField("g"):
                yield from iter_nodes(a.g)
            for g in a.graphs:
                yield from iter_nodes(g)


def node_label(node) -> str:
    """How an error names a node: its name, else the first output it produces (exporters often leave names empty)."""
    if node.name:
        return repr(node.name)
    out = next((o for o in node.output if o), None)
    return f"<unnamed, output {out!r}>" if out is not None else "'<unnamed>'"


def domain_refusal(node, tvm_ops) -> Optional[str]:
    """Why TVM's converter for ``node.op_type`` (if any) is not a converter for this node's op, or None."""
    import onnx.defs

    if node.domain in _DEFAULT_DOMAINS:
        if node.op_type in tvm_ops and not onnx.defs.has(node.op_type) and node.op_type not in ORT_ONNX_DOMAIN_OPS:
            return f"'{node.op_type}' is not an ONNX op (ONNX Runtime's contrib ops have the domain com.microsoft)"
        return None
    if node.domain == "com.microsoft" and node.op_type in MICROSOFT_OPS:
        return None
    return ort_unsupported_reason(node) or f"ops of domain '{node.domain}' are not supported by TVM's ONNX importer"


def check_graph(graph, label: str, tvm_ops) -> None:
    """Refuse, naming the first offending node or value, what TVM would convert wrongly or crash on.

    ``tvm_ops`` is the set of op names TVM's importer has a converter for (ops it lacks are refused by the caller
    with the full list)."""
    facts = _GraphFacts(graph)
    for kind, values in (("input", graph.input), ("output", graph.output)):
        for vi in values:
            if vi.type.HasField("tensor_type"):
                t = facts.types.get(vi.name)
                if t in NO_NUMPY_TYPES:
                    raise ModelLoadError(f"{label}: graph {kind} {vi.name!r} has element type {t}, which is not "
                                         f"supported (no numpy dtype holds it)")
            elif kind == "output":
                what = vi.type.WhichOneof("value")
                raise ModelLoadError(f"{label}: graph output {vi.name!r} is a {what.replace('_type', '')}, not a "
                                     f"tensor (only tensor outputs are supported)")
    for node in iter_nodes(graph):
        op = node.op_type if node.domain in _DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"
        reason = domain_refusal(node, tvm_ops) if node.op_type in tvm_ops else None
        if reason is None and node.domain in _DEFAULT_DOMAINS and node.op_type in _CHECKS:
            reason = _CHECKS[node.op_type](node, facts)
        if reason is not None:
            raise ModelLoadError(f"{label}: op {op!r} (node {node_label(node)}) is not supported: {reason}")


#: ops the importer handles outside its converter map
DIRECT_OPS = frozenset({"If", "Constant"})


def check_ops(graph, label: str, cmap) -> None:
    """Refuse a graph with ops no converter in ``cmap`` (the importer's table) takes, then :func:`check_graph` it."""
    bad = []
    for node in iter_nodes(graph):
        if node.op_type not in cmap and node.op_type not in DIRECT_OPS and not is_contrib(node):
            bad.append(node)
    if bad:
        first = bad[0]
        op = f"{first.domain}.{first.op_type}" if first.domain not in _DEFAULT_DOMAINS else first.op_type
        others = sorted({n.op_type for n in bad[1:]} - {first.op_type})
        more = f" (and {len(bad) - 1} more unsupported node(s){': ' + ', '.join(others) if others else ''})" \
            if len(bad) > 1 else ""
        reason = ort_unsupported_reason(first)
        why = f": {reason}" if reason else " by TVM's ONNX importer"
        raise ModelLoadError(f"{label}: op {op!r} (node {node_label(first)}) is not supported{why}{more}")
    check_graph(graph, label, set(cmap) | DIRECT_OPS | ORT_CONTRIB_OPS | ORT_ONNX_DOMAIN_OPS)
