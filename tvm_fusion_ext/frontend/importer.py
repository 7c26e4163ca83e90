"""ONNX → Relax, with static input shapes, weights bound as constants and one-line errors.

What this adds over ``tvm.relax.frontend.onnx.from_onnx``:

* files are read here, external data (dynamo exports write ``<model>.onnx.data``) is resolved relative to the
  model file, and missing / truncated / non-ONNX files become a :class:`ModelLoadError` naming the file;
* dynamic input dims (``dim_param``, ``0`` or ``-1``) become symbolic TIR variables with upper bounds, or are
  pinned by ``shapes=`` (see :mod:`.dims`);
* ops TVM cannot import are refused before importing, naming op type and node; a failure inside a converter is
  reported naming the node instead of a raw TVM traceback;
* legacy-exporter graphs (``torch.onnx.export(..., dynamo=False)``) import despite TVM 0.27's
  ``ConstantOfShape`` bug (see :mod:`.converters.shape`). The fixes live in a private importer subclass, so
  TVM itself is never patched;
* the ONNX input/output names are kept: TVM sanitises parameter names (``a.b`` → ``a_b``), so ``main`` carries
  the attrs ``onnx_input_names`` (one per parameter, in parameter order) and ``onnx_output_names`` (in output
  order; ``main`` returns a single tensor for one output, else a tuple). Read them with :func:`input_names`
  and :func:`output_names`; :func:`input_specs` adds shapes and dtypes.

Every graph input becomes a parameter of ``main`` even when no node uses it (TVM's importer does this and we
keep it), so a runner can always feed inputs by ONNX name.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from .checks import check_ops, iter_nodes, node_label
from .converters import convert_map
from .converters.attention import convert_onnx_attention
from .converters.common import dim_text, scalar_tensor, static_int_inputs
from .converters.control_flow import fold_static_ifs
from .converters.pad import convert_pad_in_range
from .converters.reshape import check_reshape_in_range
from .converters.slice import convert_slice_in_range
from .dims import DimRanges, given_bounds, infer_bounds, input_dims, past_length_dims, with_bounds
from .errors import InputError, ModelLoadError, NodeImportError, Unsupported
from .ort_contrib import convert as convert_ort_contrib
from .ort_contrib import is_contrib

ONNX_INPUT_NAMES_ATTR = "onnx_input_names"
ONNX_OUTPUT_NAMES_ATTR = "onnx_output_names"


# --------------------------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------------------------
def load_onnx(model, shapes: Mapping[str, Sequence[int]] | None = None,
              dtypes: Mapping[str, str] | None = None, opset: int | None = None,
              max_shapes: Mapping[str, Sequence[int]] | None = None):
    """Import an ONNX model (path or ``onnx.ModelProto``) as a Relax ``IRModule``; weights become constants.

    Dynamic input dims stay symbolic (one TIR variable per ONNX ``dim_param``, see :mod:`.dims`), each with an
    upper bound: from ``max_shapes`` (by ONNX input name, like ``shapes``), from the graph, or a default.
    ``shapes`` pins dims by ONNX input name instead (a static build; a dim the model fixes cannot be changed,
    since static exports bake it into Reshape constants). Both take shell-style patterns too
    (``"past_key_values.*"``: every cache input of a decoder). ``dtypes`` overrides input element types; ``opset``
    overrides the model's opset. Raises :class:`ModelLoadError` for the model, :class:`InputError` for bad
    ``shapes``/``max_shapes``/``dtypes``; both carry a one-line message.
    """
    import onnx

    proto, label = _read_model(model)
    if proto.functions:
        # Local functions (some dynamo exports) would otherwise reach the importer as unknown op types.
        proto = onnx.inliner.inline_local_functions(proto)
    # before the op check: a branch never taken may hold ops (or shapes) TVM cannot import
    proto, _ = fold_static_ifs(proto)
    graph = proto.graph
    init_names = {t.name for t in graph.initializer}
    graph_inputs = [i for i in graph.input if i.name not in init_names]
    shape_dict, dim_vars = input_dims(graph_inputs, shapes, label)
    dtype_dict = _check_dtypes(graph_inputs, dtypes, label)
    check_ops(graph, label, convert_map())
    ranges = DimRanges(dim_vars, given_bounds(dim_vars, graph_inputs, max_shapes, label),
                       may_be_empty=past_length_dims(graph_inputs))
    try:
        mod = _import(proto, label, shape_dict, dtype_dict, opset, ranges)
    except NodeImportError as err:
        # TVM's error on a file that breaks ONNX's own typing rules (torch's legacy exporter writes fp16 models
        # whose LayerNormalization mixes float32 data with float16 weights) names a symptom; ONNX names the cause.
        invalid = _onnx_type_error(proto)
        if invalid:
            raise ModelLoadError(f"{label}: not a valid ONNX model: {invalid}") from None
        raise

    main = mod["main"]
    n_in = len(graph_inputs)
    if len(main.params) != n_in:  # defensive: the importer's param order is what the attr below relies on
        raise ModelLoadError(f"{label}: imported 'main' has {len(main.params)} parameters for {n_in} graph inputs")
    main = main.with_attrs({
        ONNX_INPUT_NAMES_ATTR: [i.name for i in graph_inputs],
        ONNX_OUTPUT_NAMES_ATTR: [o.name for o in graph.output],
    })
    if dim_vars:
        bounds, reasons = infer_bounds(mod, dim_vars, graph_inputs, max_shapes, label, ranges)
        main = with_bounds(main, bounds, ranges.lower_bounds(), reasons)
    elif max_shapes:
        raise InputError(f"{label}: max shapes given, but no input dim is dynamic")
    mod["main"] = main
    if any(node.op_type == "If" for node in graph.node):
        # an If (not folded above) cannot sit in a dataflow block, so TVM imports the whole graph as plain
        # bindings, and its branches too: every fusion rule works on dataflow blocks and found nothing (a merged
        # decoder's use_cache_branch). Each run of pure bindings, in the branches and around them, becomes one.
        from tvm import relax

        mod = relax.transform.ConvertToDataflow(min_size=1)(mod)
    return mod


def input_names(mod) -> list[str]:
    """ONNX input names of ``mod["main"]``'s parameters, in parameter order (Relax names if not imported here)."""
    main = _main(mod)
    names = _attr_list(main, ONNX_INPUT_NAMES_ATTR)
    return names if names is not None else [p.name for p in main.params]


def output_names(mod) -> list[str]:
    """ONNX output names of ``mod["main"]``, in output order (``output_<i>`` if not imported here)."""
    main = _main(mod)
    names = _attr_list(main, ONNX_OUTPUT_NAMES_ATTR)
    if names is not None:
        return names
    from tvm import relax

    ty = main.ret_ty if hasattr(main, "ret_ty") else main.body.ty
    n = len(ty.fields) if isinstance(ty, relax.TupleType) else 1
    return [f"output_{i}" for i in range(n)]


def input_specs(mod) -> dict[str, tuple[tuple, str]]:
    """``{onnx_input_name: (shape, dtype)}`` for ``mod["main"]``'s parameters, in parameter order. A static dim is
    an ``int``, a symbolic one the name of its variable (``"batch"``); :func:`~.dims.shape_bounds` bounds those."""
    from tvm import tirx

    main = _main(mod)
    specs = {}
    for name, param in zip(input_names(mod), main.params):
        ty = param.ty
        dims = tuple(int(d) if isinstance(d, tirx.IntImm) else str(d) for d in ty.shape.values)
        specs[name] = (dims, str(ty.dtype))
    return specs


_SHAPE_ITEM = re.compile(r"^\s*(?P<name>[^:,]+?)\s*:\s*(?P<dims>\d+(?:\s*[x×]\s*\d+)*)\s*$")


def parse_shape_arg(text: str) -> dict[str, list[int]]:
    """Parse ``"input_ids:1x128,attention_mask:1x128"`` into ``{"input_ids": [1, 128], ...}``.

    Input names may contain anything but ``:`` and ``,``; a scalar input cannot be written this way (it
    needs no shape). Raises :class:`InputError` naming the bad item.
    """
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"empty shape argument {text!r}; expected NAME:DxD[,NAME:DxD...] e.g. input_ids:1x128")
    out: dict[str, list[int]] = {}
    for item in text.split(","):
        m = _SHAPE_ITEM.match(item)
        if m is None:
            raise InputError(f"bad shape item {item.strip()!r} in {text!r}; expected NAME:DxD e.g. input_ids:1x128")
        name = m.group("name")
        dims = [int(d) for d in re.split(r"\s*[x×]\s*", m.group("dims"))]
        if any(d < 0 for d in dims):  # 0 is a past (KV cache) length's first step; load_onnx refuses it elsewhere
            raise InputError(f"shape item {item.strip()!r} has a dimension < 0")
        if name in out:
            raise InputError(f"input {name!r} is given twice in shape argument {text!r}")
        out[name] = dims
    return out


# --------------------------------------------------------------------------------------------------------------
# reading the file
# --------------------------------------------------------------------------------------------------------------
def _read_model(model):
    """Return ``(ModelProto with all tensor data loaded, label used in error messages)``."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        label = f"ONNX model {model.graph.name!r}" if model.graph.name else "ONNX model"
        for t in _external_tensors(model):
            if not t.HasField("raw_data"):
                raise ModelLoadError(
                    f"{label}: tensor {t.name!r} has its data in external file {_ext_location(t)!r} that is "
                    f"not loaded; pass the model's file path instead of a ModelProto")
        _check_is_model(model, label)
        return model, label
    if not isinstance(model, (str, os.PathLike)):
        raise ModelLoadError(f"expected an ONNX file path or onnx.ModelProto, got {type(model).__name__}")
    path = os.fspath(model)
    label = path
    if not os.path.exists(path):
        raise ModelLoadError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ModelLoadError(f"{path}: is a directory, not an ONNX file")
    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception as err:  # protobuf DecodeError and friends: a truncated or foreign file
        raise ModelLoadError(f"{path}: not a readable ONNX model ({_one_line(err)})") from None
    _check_is_model(proto, label)
    base = os.path.dirname(os.path.abspath(path))
    ext = _external_tensors(proto)
    for t in ext:
        # Checked here so a missing or short .data file is named, instead of failing later in numpy.
        info = {e.key: e.value for e in t.external_data}
        loc = os.path.join(base, info["location"])
        if not os.path.isfile(loc):
            raise ModelLoadError(f"{path}: external data file {info['location']!r} (tensor {t.name!r}) not found "
                                 f"next to the model")
        end = int(info.get("offset", 0)) + int(info.get("length", 0))
        if end > os.path.getsize(loc):
            raise ModelLoadError(f"{path}: external data file {info['location']!r} is truncated (tensor {t.name!r} "
                                 f"needs {end} bytes, file has {os.path.getsize(loc)})")
    if ext:
        try:
            from onnx.external_data_helper import load_external_data_for_model

            load_external_data_for_model(proto, base)
        except Exception as err:
            raise ModelLoadError(f"{path}: cannot read external data ({_one_line(err)})") from None
    return proto, label


def _external_tensors(proto):
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    return [t for t in _get_all_tensors(proto) if uses_external_data(t)]


def _ext_location(t) -> str:
    return {e.key: e.value for e in t.external_data}.get("location", "?")


def _check_is_model(proto, label):
    # Protobuf happily parses many foreign byte strings into an "empty" ModelProto: catch that here.
    if proto.ir_version <= 0 or not proto.graph.output or not proto.opset_import:
        raise ModelLoadError(f"{label}: not an ONNX model (no ir_version, opset or graph outputs)")
    if proto.ir_version < 3:
        raise ModelLoadError(f"{label}: ONNX IR version {proto.ir_version} is too old (need >= 3)")


# --------------------------------------------------------------------------------------------------------------
# checks before importing
# --------------------------------------------------------------------------------------------------------------
def _check_dtypes(graph_inputs, dtypes, label) -> dict[str, str]:
    from tvm.relax.frontend.onnx.onnx_frontend import get_type

    known = [i.name for i in graph_inputs]
    dtypes = dict(dtypes or {})
    for name, dt in dtypes.items():
        if name not in known:
            raise InputError(f"{label}: dtypes names unknown input {name!r}; model inputs are: {', '.join(known)}")
        try:
            np.dtype(dt)
        except TypeError:
            raise InputError(f"{label}: dtype {dt!r} for input {name!r} is not a dtype") from None
    out = {}
    for vi in graph_inputs:
        if vi.name in dtypes:
            out[vi.name] = str(np.dtype(dtypes[vi.name]))
            continue
        et = vi.type.tensor_type.elem_type
        try:
            out[vi.name] = get_type(et)
        except Exception:
            raise ModelLoadError(f"{label}: input {vi.name!r} has element type {et} that TVM cannot import") from None
    return out


# --------------------------------------------------------------------------------------------------------------
# importing
# --------------------------------------------------------------------------------------------------------------
def _import(proto, label, shape_dict, dtype_dict, opset, ranges):
    model_opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
    opset = model_opset if opset is None else int(opset)
    importer = _importer_class()(label, ranges, shape_dict, dtype_dict, keep_params_in_input=False, sanitize=True)
    with warnings.catch_warnings():
        # We record the ONNX names ourselves, so TVM's per-input rename warnings are noise.
        warnings.filterwarnings("ignore", message=r"Renaming name ")
        # TVM folds Cast of constants with numpy; ONNX leaves a float out of the integer range (MPNet's log(0)
        # position buckets, discarded by a Where after it) undefined, so numpy's warning is noise here
        warnings.filterwarnings("ignore", message=r"invalid value encountered in cast", category=RuntimeWarning)
        # TVM prints every failing node's full inputs to stdout before re-raising; our error replaces that.
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                return importer.from_onnx(proto.graph, opset)
            except ModelLoadError:
                raise
            except Exception as err:  # anything else from deep inside TVM
                raise ModelLoadError(f"{label}: TVM's ONNX importer failed: {_one_line(err)}") from None


_IMPORTER: dict = {}


def _importer_class():
    """TVM's graph importer with our converter map and node-naming errors (a subclass: TVM is not patched)."""
    if _IMPORTER:
        return _IMPORTER["class"]
    import onnx
    from tvm.relax.frontend.onnx import onnx_frontend as of

    class _Importer(of.ONNXGraphImporter):
        def __init__(self, label, ranges, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._label = label
            self._ranges = ranges  # the input dims' ranges, which in-range slices may narrow
            self._cmap = convert_map()

        def _check_for_unsupported_ops(self, graph):
            pass  # done by check_ops before we get here, with node names

        def from_onnx(self, graph, opset):
            self._consumers = _consumer_ops(graph)
            self._node_outputs = ()
            self._node_domain = ""
            self._node_contrib = False
            try:
                return super().from_onnx(graph, opset)
            except BaseException:
                _close_builder(self.bb)
                raise

        def _construct_nodes(self, graph):
            super()._construct_nodes(graph)
            # A graph output computed by Shape is a Relax shape, which the VM returns as a ShapeTuple, not a tensor
            for out in graph.output:
                value = self._nodes.get(out.name)
                if isinstance(value, of.relax.Expr) and isinstance(value.ty, of.relax.ShapeType):
                    self._nodes[out.name] = self.bb.emit(of.relax.op.shape_to_tensor(value))

        def _parse_value_proto(self, value_proto):
            # TVM names a node by node.name in its errors; most exporters leave it empty
            if isinstance(value_proto, onnx.NodeProto):
                self._node_outputs = tuple(value_proto.output)  # called once per node, before its conversion
                self._node_domain = value_proto.domain
                self._node_contrib = is_contrib(value_proto)
                return node_label(value_proto)
            return super()._parse_value_proto(value_proto)

        def _convert_operator(self, op_name, inputs, attrs, opset):
            node = attrs.get("tvm_custom", {}).get("name") or "'<unnamed>'"
            if op_name not in self._cmap and not self._node_contrib:
                raise ModelLoadError(f"{self._label}: op {op_name!r} (node {node}) is not supported by TVM's "
                                     f"ONNX importer")
            try:
                if self._node_contrib:
                    # ONNX Runtime's contrib ops, by domain: TVM's map is keyed by name alone ("Gelu", "Attention")
                    sym = convert_ort_contrib(self._node_domain, op_name, self.bb, inputs, attrs, self._node_outputs)
                elif op_name == "Attention" and self._node_domain in ("", "ai.onnx"):
                    # TVM's map keys converters by name alone; its "Attention" is com.microsoft's
                    sym = convert_onnx_attention(self.bb, inputs, attrs)
                else:
                    inputs = _float_sizes_as_tensors(self.bb, inputs, op_name)
                    sym = self._slice_in_range(inputs, node) if op_name == "Slice" and opset >= 10 else None
                    if op_name == "Pad" and opset >= 11:
                        sym = convert_pad_in_range(self.bb, list(inputs), attrs, self._ranges, node)
                    if sym is None:
                        sym = self._cmap[op_name].get_converter(opset)(self.bb, inputs, attrs,
                                                                       [self._nodes, self._params])
                sym = _first_of_one_output(self.bb, sym, op_name, attrs)
                if isinstance(sym, of.relax.Expr):
                    sym = self._shape_as_tensor_if_needed(self.bb.normalize(sym))
                if op_name == "Reshape" and inputs and isinstance(sym, of.relax.Expr):
                    check_reshape_in_range(inputs[0], sym, self._ranges, node, self._label)
            except ModelLoadError:
                raise
            except Unsupported as err:
                raise ModelLoadError(f"{self._label}: op {self._op_label(op_name)!r} (node {node}) is not supported: "
                                     f"{err}") from None
            except Exception as err:
                raise NodeImportError(f"{self._label}: TVM cannot import node {node} (op {self._op_label(op_name)}): "
                                       f"{_one_line(err)}") from None
            lost = _shape_loss(sym, inputs, node, self._op_label(op_name)) if isinstance(sym, of.relax.Expr) else None
            if lost is not None and op_name in _ELEMENTWISE_BINARY and not self._node_contrib:
                tied = _tie_broadcast_dims(self.bb, inputs)
                if tied is not None:
                    sym = self._cmap[op_name].get_converter(opset)(self.bb, tied, attrs, [self._nodes, self._params])
                    sym = self.bb.normalize(sym)
                    lost = _shape_loss(sym, tied, node, self._op_label(op_name))
            if lost is not None and op_name in _SHAPE_RELATING and not self._node_contrib:
                # a tensor of unknown shape cannot be built (TVM's legalization asserts on it: "emit_te now only
                # supports Tensor that has ShapeExpr shape"), and the next Shape of it is refused with TVM's
                # "Check failed" text: refuse here, at the node that lost it
                raise NodeImportError(f"{self._label}: {lost}; give such dims one name, or pin them with --shape")
            return sym

        def _op_label(self, op_name):
            return op_name if self._node_domain in ("", "ai.onnx") else f"{self._node_domain}.{op_name}"

        def _slice_in_range(self, inputs, node):
            inputs = list(inputs)
            return convert_slice_in_range(self.bb, static_int_inputs(self.bb, inputs, range(1, len(inputs))),
                                          self._ranges, node)

        def _shape_as_tensor_if_needed(self, sym):
            """A shape (``Shape``, or a slice/gather/concat of one) read by an op that takes tensors only becomes a
            tensor here: TVM refuses such an input ("Node cannot handle ShapeExpr inputs"), which every
            ONNX function body that does arithmetic on a size hit (the expanded Attention, LayerNormalization,
            RMSNormalization, ...). Where all readers take shapes it stays a shape, which keeps dims symbolic."""
            if not isinstance(sym.ty, of.relax.ShapeType) or len(self._node_outputs) != 1:
                return sym
            if self._consumers.get(self._node_outputs[0], set()) <= SHAPE_CONSUMERS:
                return sym
            return self.bb.normalize(of.relax.op.shape_to_tensor(sym))

    _IMPORTER["class"] = _Importer
    return _Importer


#: ops TVM's importer lets read a Relax shape (its ``shape_compatible_ops``); others need a tensor
SHAPE_CONSUMERS = frozenset({"Reshape", "Resize", "ConstantOfShape", "Gather", "Slice", "Shape", "Expand", "Concat",
                             "Equal", "Where", "Cast", "CastLike", "Squeeze"})


def _consumer_ops(graph) -> dict:
    """``{value name: op types of the nodes reading it}`` over the graph and its subgraphs."""
    readers: dict = {}
    for node in iter_nodes(graph):
        for name in node.input:
            if name:
                readers.setdefault(name, set()).add(node.op_type)
    return readers


# --------------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------------
def _onnx_type_error(proto) -> str | None:
    """ONNX's strict type and shape inference's complaint about ``proto`` (first line), or None when it has none
    (or cannot run, as for a model past protobuf's 2 GB)."""
    import onnx

    try:
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    except onnx.shape_inference.InferenceError as err:
        return str(err).strip().splitlines()[0][:300]
    except Exception:  # noqa: BLE001  (no verdict: keep TVM's error)
        return None
    return None


#: TVM prints an operator as its whole registration (``ir.Op(span=None, ..., name="relax.nn.layer_norm", ...,
#: support_level=10)``), which would fill a one-line error before the reason that follows it
_OP_REPR = re.compile(r'ir\.Op\(.*?name="(?P<name>[^"]+)".*?support_level=\d+\)')


#: ops TVM's importer computes on TIR scalars, so that float arithmetic on sizes (``ceil(seq / 16.0) * 16``, a pad
#: to a block) stays a size the shapes after it can use
_SCALAR_ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div", "Cast", "Ceil", "Floor", "Round", "Neg", "Abs", "Max",
                                "Min", "Unsqueeze", "Concat", "Reshape", "Squeeze", "Identity"})


def _float_sizes_as_tensors(bb, inputs, op_name: str):
    """A size cast to float (``Shape -> Gather -> Cast(float)``) stays a TIR scalar in TVM's importer, which only its
    arithmetic converters take: ``Sqrt`` of it (a scale ``1 / sqrt(dim)``) was refused with "requires argument 0 (x)
    to be a tensor", and a ``Div`` of a tensor by it failed with TVM's "Check failed". Such an op gets the scalar as a
    0-d tensor; arithmetic among scalars and constants keeps it a scalar (a size computed in float still sizes a
    Pad or Reshape)."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as of

    def is_float_size(x):
        return tvm.ir.is_prim_expr(x) and str(x.ty).startswith(("float", "bfloat"))

    def is_run_time_tensor(x):
        return isinstance(getattr(x, "ty", None), relax.TensorType) and not isinstance(x, tvm.ir.GenericConst)

    if not any(is_float_size(x) for x in inputs):
        return inputs
    if op_name in _SCALAR_ARITHMETIC and not any(is_run_time_tensor(x) for x in inputs):
        return inputs
    return of.onnx_input(scalar_tensor(bb, x) if is_float_size(x) else x for x in inputs)  # reads None past its end


#: ops whose output is the broadcast of their two inputs' shapes
_ELEMENTWISE_BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal", "Less", "LessOrEqual",
                                 "Greater", "GreaterOrEqual", "And", "Or", "Xor"})

#: ops whose output shape follows from their inputs' (so a shape TVM cannot infer means dims it cannot show
#: compatible), unlike a Slice or Reshape whose output shape may be computed at run time (which TVM can build)
_SHAPE_RELATING = _ELEMENTWISE_BINARY | {"Where", "Concat", "MatMul", "Gemm", "Sum", "Mean", "Mod", "BitShift",
                                         "BitwiseAnd", "BitwiseOr", "BitwiseXor", "PRelu"}


def _tie_broadcast_dims(bb, inputs):
    """``inputs`` (two tensors) with the second's dims that TVM cannot show equal to the first's, or 1, match-cast to
    the first's (the first's, where only the second's dim is a number): a run-time check that they are equal, after
    which the sum has a known shape. A KV-cache export's mask is ``[.., total]`` beside scores ``[.., past + new]``
    (BLOOM), or the scores are ``[.., min(past, 7) + new]`` beside a mask ``[.., past + new]`` (a sliding-window
    cache: equal while the past fits the window; past it, ONNX Runtime fails on the file as well). A size that is 1
    at run time where the other is not (ONNX broadcasting) then fails that check, in one line naming the inputs.
    None where nothing can be tied (ranks differ, two different numbers)."""
    from tvm import relax, sym

    from .converters.common import is_static

    if len(inputs) != 2 or not all(isinstance(getattr(x, "ty", None), relax.TensorType) and x.ty.shape is not None
                                   for x in inputs):
        return None
    a, b = inputs
    da, db = list(a.ty.shape.values), list(b.ty.shape.values)
    if len(da) != len(db):
        return None
    analyzer = sym.Analyzer()
    new_a, new_b, changed = list(da), list(db), False
    for i, (x, y) in enumerate(zip(da, db)):
        if (is_static(x) and int(x) == 1) or (is_static(y) and int(y) == 1):
            continue
        if is_static(x) and is_static(y):
            if int(x) != int(y):
                return None
            continue
        if analyzer.can_prove_equal(x, y):
            continue
        if is_static(y):
            new_a[i] = y
        else:
            new_b[i] = x
        changed = True
    if not changed:
        return None
    cast = [x if new == old else bb.match_cast(x, relax.TensorType(new, str(x.ty.dtype)))
            for x, new, old in ((a, new_a, da), (b, new_b, db))]
    from tvm.relax.frontend.onnx import onnx_frontend as of

    return of.onnx_input(cast)


def _shape_loss(sym, inputs, node: str, op: str):
    """Why this node cannot be built, when its output is a tensor of unknown shape although every tensor input's shape
    is known: TVM could not show its inputs' dims compatible (``[.., min(past, 7) + seq]`` added to ``[.., past +
    seq]``: a KV cache cropped to a sliding window beside a mask of the full length; a Concat of rows counted by
    two dims of different names). None otherwise."""
    from tvm import relax

    ty = getattr(sym, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is not None:
        return None
    shapes = [x.ty.shape for x in inputs if isinstance(getattr(x, "ty", None), relax.TensorType)]
    if len(shapes) < 2 or any(sh is None for sh in shapes):
        return None
    text = " and ".join("[" + ", ".join(dim_text(d) for d in sh.values) + "]" for sh in shapes)
    text = re.sub(r"\bT\.(min|max)\(", r"\1(", text).replace(str(2**63 - 1), "INT64_MAX")
    text = text if len(text) <= 240 else text[:237] + "..."
    return (f"node {node} (op {op}) combines shapes {text}, whose dims cannot be shown compatible for every input "
            f"size (the export computes them differently), so its output's shape is unknown")


def _one_line(err: BaseException, limit: int = 300) -> str:
    # Keep the message, drop any traceback lines TVM may have appended, and bound the length.
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("File ", "^", "Traceback", "at "))]
    msg = _OP_REPR.sub(lambda m: m["name"], " ".join(lines))
    msg = f"{type(err).__name__}: {msg}" if msg else type(err).__name__
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def _close_builder(bb) -> None:
    """End the binding block and the scope a failed ``from_onnx`` leaves open (the function scope's exit does not):
    TVM's BlockBuilder otherwise prints "destroyed with remaining blocks" to stderr when it is collected, a second
    line after our one-line error. Exactly one of each is open (ending one that is not segfaults)."""
    bb._end_block()
    bb.end_scope()


def _main(mod):
    try:
        return mod["main"]
    except Exception:
        raise InputError("module has no 'main' function") from None


def _attr_list(func, key):
    attrs = func.attrs
    if attrs is None or key not in attrs:
        return None
    return [str(x) for x in attrs[key]]


#: ops whose one ONNX output is a sequence (a Relax tuple): never cut to its first field
_SEQUENCE_OUTPUT_OPS = frozenset({"Optional", "OptionalGetElement", "SequenceConstruct", "SequenceEmpty",
                                  "SequenceErase", "SequenceInsert", "ConcatFromSequence", "SplitToSequence"})


def _first_of_one_output(bb, sym, op_name: str, attrs: dict):
    """A converter's tuple for a node that names one output (LayerNormalization's ``(Y, Mean, InvStdDev)`` when
    only Y is asked for), cut to that output. The top-level graph does this after the converter; TVM's import of
    an ``If`` branch does not, and its consumer then received the whole tuple (a Relu: "relax.nn.relu requires
    argument 0 (x) to be a tensor")."""
    from tvm import relax

    wanted = (attrs.get("tvm_custom") or {}).get("num_outputs")
    if wanted == 1 and isinstance(sym, relax.Tuple) and len(sym.fields) > 1 and op_name not in _SEQUENCE_OUTPUT_OPS:
        first = sym.fields[0]
        # bound, as converters' results are: TVM's binary converters fold any operand that is not a call or a
        # variable as a constant (BatchNormalization's output read by a Mul)
        return bb.emit(first) if isinstance(first, (relax.Call, relax.TupleGetItem)) else first
    return sym
