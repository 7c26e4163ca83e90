"""ONNX ``If`` nodes whose condition is known before import: keep the branch taken, drop the other.

Pattern: ``If(cond)`` where ``cond`` is computed from constants and from the *static* part of tensor shapes,
e.g. torch's legacy ``repeat``/``tile`` export (``If(Size(Shape(x)) - 1 > 0)``: a rank test) or ViTDet's
``if rel_pos.shape[0] != max_rel_dist: interpolate`` on a parameter of fixed size.

Why: TVM's importer converts *both* branches of every ``If`` and emits a Relax ``If``. The branch not taken
is often one TVM cannot import (DINOv3's rope tiling reshapes to a shape computed in a tensor; ViTDet's untaken
resize), so a model that runs fine fails at import; and a Relax ``If`` in ``main`` also ends its dataflow block,
which the fusion passes work inside.

Check: the condition is evaluated with numpy over the nodes that produce it, reading a tensor's shape only where
ONNX shape inference (or the graph's own declarations) fixes it; a rank is enough for ``Size(Shape(x))``. Any
value that depends on input data or on a dynamic dim leaves the ``If`` as it is (TVM's import, as before).

Rewrite: the taken branch's nodes go where the ``If`` was (ONNX names are unique across subgraphs, and a branch
reads only values defined before its ``If``), and an ``Identity`` per output gives the ``If``'s output names.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

UNKNOWN = None


def fold_static_ifs(proto):
    """``(model, folded)``: ``proto`` with every import-time ``If`` replaced by its taken branch (a copy; the
    caller's model is not changed), or ``proto`` itself and 0 when there is none."""
    import onnx

    if not any(n.op_type == "If" for n in proto.graph.node):
        return proto, 0
    shapes = _static_shapes(proto)
    model, folded = None, 0
    while True:
        graph = (model or proto).graph
        values = _Evaluator(graph, shapes)
        nodes: List = []
        changed = False
        for node in graph.node:
            taken = values.branch_taken(node) if node.op_type == "If" else None
            if taken is None:
                nodes.append(node)
                continue
            changed = True
            folded += 1
            nodes.extend(taken.node)
            for out, branch_out in zip(node.output, taken.output):
                nodes.append(onnx.helper.make_node("Identity", [branch_out.name], [out],
                                                   name=f"{node.name or out}/taken_branch"))
        if not changed:
            if folded:
                _freeze_size_inputs(model, _Evaluator(model.graph, shapes))
            return (model or proto), folded
        if model is None:
            model = onnx.ModelProto()
            model.CopyFrom(proto)
        del model.graph.node[:]
        model.graph.node.extend(nodes)


# inputs that are sizes, not data: where a folded branch computed one, TVM's importer must see it as a constant
SIZE_INPUTS = {"Tile": 1, "Expand": 1, "Reshape": 1, "ConstantOfShape": 0}


def _freeze_size_inputs(model, values) -> None:
    """A size input the taken branch computed from ranks (DINOv3's tile repeats) becomes a Constant."""
    import onnx
    from onnx import numpy_helper

    nodes = []
    for node in model.graph.node:
        at = SIZE_INPUTS.get(node.op_type)
        src = node.input[at] if at is not None and len(node.input) > at else ""
        producer = values.producer.get(src)
        if producer is not None and producer.op_type != "Constant":
            known = values.value(src)
            if known is not None and known.dtype.kind in "iu":
                name = f"{src}/import_time"
                nodes.append(onnx.helper.make_node("Constant", [], [name], name=name,
                                                   value=numpy_helper.from_array(known.astype(np.int64), name)))
                node.input[at] = name
                values.memo[name] = known  # later size inputs may be computed from this one
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _static_shapes(proto) -> Dict[str, Optional[list]]:
    """Every value's dims as far as the graph or ONNX shape inference knows them (None for an unknown dim)."""
    import onnx

    shapes: Dict[str, Optional[list]] = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(proto).graph
    except Exception:  # noqa: BLE001  (a model ONNX cannot infer, or one over 2 GB: use its declarations)
        inferred = proto.graph
    for graph in (proto.graph, inferred):
        for t in graph.initializer:
            shapes[t.name] = list(t.dims)
        for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
            shapes.setdefault(vi.name, _dims_of(vi))
        _subgraph_shapes(graph, shapes)
    return shapes


def _subgraph_shapes(graph, shapes) -> None:
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("g"):
                for vi in list(a.g.value_info) + list(a.g.output):
                    shapes.setdefault(vi.name, _dims_of(vi))
                _subgraph_shapes(a.g, shapes)


def _dims_of(value_info) -> Optional[list]:
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else UNKNOWN for d in t.shape.dim]


class _Evaluator:
    """Import-time values of a graph's small integer/boolean computations (numpy), or None where unknown."""

    _BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Equal": np.equal, "Greater": np.greater,
               "Less": np.less, "GreaterOrEqual": np.greater_equal, "LessOrEqual": np.less_equal,
               "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor, "Max": np.maximum,
               "Min": np.minimum}
    _UNARY = {"Not": np.logical_not, "Abs": np.abs, "Neg": np.negative, "Identity": lambda v: v}
    # a tensor this large is data, not a size computation: never materialised here
    MAX_ELEMENTS = 64

    def __init__(self, graph, shapes):
        self.shapes = shapes
        self.producer = {o: n for n in graph.node for o in n.output}
        self.initializers = {t.name: t for t in graph.initializer}
        self.memo: Dict[str, object] = {}

    def branch_taken(self, node):
        cond = self.value(node.input[0])
        if cond is None or np.size(cond) != 1:
            return None
        branches = {a.name: a.g for a in node.attribute if a.HasField("g")}
        return branches.get("then_branch" if bool(np.asarray(cond).reshape(())) else "else_branch")

    def value(self, name: str):
        if name not in self.memo:
            self.memo[name] = None  # a cycle (impossible in a valid graph) reads as unknown
            try:
                self.memo[name] = self._compute(name)
            except Exception:  # noqa: BLE001  (anything numpy cannot do the ONNX way stays unknown)
                self.memo[name] = None
        return self.memo[name]

    def rank(self, name: str) -> Optional[int]:
        dims = self.shapes.get(name)
        return None if dims is None else len(dims)

    def _compute(self, name: str):
        from onnx import numpy_helper

        if name in self.initializers:
            t = self.initializers[name]
            return numpy_helper.to_array(t) if int(np.prod(t.dims)) <= self.MAX_ELEMENTS else None
        node = self.producer.get(name)
        if node is None:
            return None
        op, attrs = node.op_type, {a.name: a for a in node.attribute}
        if op == "Constant":
            return _constant(attrs)
        if op == "Shape":
            dims = self.shapes.get(node.input[0])
            if dims is None:
                return None
            start = attrs["start"].i if "start" in attrs else 0
            end = attrs["end"].i if "end" in attrs else len(dims)
            picked = dims[slice(start, end)]
            return None if UNKNOWN in picked else np.asarray(picked, dtype=np.int64)
        if op == "Size" and self.producer.get(node.input[0]) is not None \
                and self.producer[node.input[0]].op_type == "Shape":
            # the number of entries of a shape is a rank, known where the dims themselves are not
            shape_node = self.producer[node.input[0]]
            full = self.rank(shape_node.input[0])
            if full is None:
                return None
            sa = {a.name: a.i for a in shape_node.attribute}
            return np.asarray(len(range(full)[slice(sa.get("start", 0), sa.get("end", full))]), dtype=np.int64)
        inputs = [self.value(i) if i else None for i in node.input]
        if any(v is None for v in inputs):
            return None
        if op in self._BINARY:
            return self._BINARY[op](inputs[0], inputs[1])
        if op in self._UNARY:
            return self._UNARY[op](inputs[0])
        if op == "Size":
            return np.asarray(np.size(inputs[0]), dtype=np.int64)
        if op == "Cast":
            from onnx import helper

            return inputs[0].astype(helper.tensor_dtype_to_np_dtype(attrs["to"].i))
        if op == "Gather":
            axis = attrs["axis"].i if "axis" in attrs else 0
            return np.take(inputs[0], inputs[1], axis=axis)
        if op in ("Squeeze", "Unsqueeze", "Reshape"):
            if op == "Reshape":
                # ONNX's 0 copies the input's dim (numpy has no such entry): left unknown, it is rare here
                return None if 0 in inputs[1] else inputs[0].reshape(inputs[1])
            axes = inputs[1] if len(inputs) > 1 else np.asarray(attrs["axes"].ints) if "axes" in attrs else None
            if op == "Squeeze":
                return np.squeeze(inputs[0], None if axes is None else tuple(int(a) for a in axes))
            return np.expand_dims(inputs[0], tuple(int(a) for a in axes))
        if op == "Concat":
            return np.concatenate(inputs, axis=attrs["axis"].i)
        if op == "Expand":
            # ONNX's Expand broadcasts both ways (a 1 in the shape keeps the input's dim)
            return np.broadcast_to(inputs[0], np.broadcast_shapes(inputs[0].shape, tuple(int(d) for d in inputs[1])))
        return None


def _constant(attrs):
    from onnx import numpy_helper

    if "value" in attrs:
        arr = numpy_helper.to_array(attrs["value"].t)
        return arr if arr.size <= _Evaluator.MAX_ELEMENTS else None
    if "value_int" in attrs:
        return np.asarray(attrs["value_int"].i, dtype=np.int64)
    if "value_ints" in attrs:
        return np.asarray(list(attrs["value_ints"].ints), dtype=np.int64)
    if "value_float" in attrs:
        return np.asarray(attrs["value_float"].f, dtype=np.float32)
    if "value_floats" in attrs:
        return np.asarray(list(attrs["value_floats"].floats), dtype=np.float32)
    return None
