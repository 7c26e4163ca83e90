"""Slices of symbolic dims read in range (``frontend/converters/slice.py``), the input ranges they narrow
(``dims.DimRanges``), and the importer fixes the legacy dynamic-axes exports of BEiT, wav2vec2, MobileBERT and MPT
needed beside them. Numerics against ONNX Runtime at several sizes, bounds by ``shape_bounds``, refusals by their
one-line errors."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tvm_fusion_ext.frontend.dims import shape_bounds
from tvm_fusion_ext.errors import InputError, ModelLoadError
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.runtime import CompiledModel

END = np.iinfo(np.int64).max


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _ints(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _main_out_shape(mod):
    ty = mod["main"].body.ty if not hasattr(mod["main"], "ret_ty") else mod["main"].ret_ty
    return None if ty.shape is None else [re.sub(r"T\.int64\((-?\d+)\)", r"\1", str(d)) for d in ty.shape.values]


def _x(batch, seq, width=4, seed=0):
    return np.random.default_rng(seed + seq).standard_normal((batch, seq, width)).astype(np.float32)


# ---- constant bounds on a symbolic dim: MobileBERT's trigram shift -----------------------------------------

def _shift_model():
    """``x + concat(x[:, 1:], 0)``: the shifted sequence put back beside the original, as MobileBERT's trigram
    input does; TVM's own converter leaves the Add without a shape (its slice extent keeps both clamps)."""
    nodes = [helper.make_node("Slice", ["x", "one", "end", "axis1"], ["tail"], name="shift"),
             helper.make_node("Pad", ["tail", "pads"], ["padded"], name="pad"),
             helper.make_node("Add", ["x", "padded"], ["y"], name="add")]
    inits = [_ints("one", [1]), _ints("end", [END]), _ints("axis1", [1]), _ints("pads", [0, 0, 0, 0, 1, 0])]
    return _model(nodes, [_vi("x", TP.FLOAT, ["batch", "seq", 4])], [_vi("y", TP.FLOAT, ["batch", "seq", 4])],
                  inits)


def test_constant_slice_of_a_symbolic_dim_keeps_a_known_shape(run_ort):
    m = _shift_model()
    mod = load_onnx(m)
    assert _main_out_shape(mod) == ["batch", "seq", "4"]
    assert shape_bounds(mod) == {"batch": (1, 64), "seq": (1, 512)}  # x[:, 1:] is in range for every seq >= 1
    model = CompiledModel.from_module(mod, fuse=False)
    for batch, seq in ((1, 1), (2, 5), (3, 17)):
        x = _x(batch, seq)
        np.testing.assert_allclose(model.run({"x": x})["y"], run_ort(m, {"x": x})[0], rtol=1e-6, atol=1e-6)


def test_constant_slice_past_a_short_dim_keeps_the_exact_reading(run_ort):
    """``x[:, :4]`` of a sequence that may be shorter than 4 is not in range for every seq: the importer does not
    narrow seq to >= 4 for it (short inputs are valid), and the result is ONNX's clamped slice."""
    nodes = [helper.make_node("Slice", ["x", "zero", "four", "axis1"], ["y"], name="head")]
    m = _model(nodes, [_vi("x", TP.FLOAT, ["batch", "seq", 4])], [_vi("y", TP.FLOAT, ["batch", None, 4])],
               [_ints("zero", [0]), _ints("four", [4]), _ints("axis1", [1])])
    mod = load_onnx(m)
    assert shape_bounds(mod)["seq"] == (1, 512)
    model = CompiledModel.from_module(mod, fuse=False)
    for seq in (2, 4, 9):
        x = _x(2, seq)
        np.testing.assert_array_equal(model.run({"x": x})["y"], x[:, :4])


# ---- bounds computed from a dim: MPT's ALiBi slice ----------------------------------------------------------

def _alibi_model(start: str):
    """``scores + table[:, -seq:]``, a table of 128 positions read at the last ``seq`` of them, with the start as an
    exporter writes it: ``-seq`` (``minus-seq``), ``128 - seq`` (``n-minus-seq``, the legacy export) or
    ``max(128 - seq, 0)`` (``clamped``, torch.export's own normalisation)."""
    table = np.random.default_rng(3).standard_normal((4, 128)).astype(np.float32)
    nodes = [helper.make_node("Shape", ["scores"], ["shape"], start=2, end=3, name="len")]
    if start == "minus-seq":
        nodes.append(helper.make_node("Neg", ["shape"], ["start"], name="start"))
    else:
        nodes.append(helper.make_node("Sub", ["n", "shape"], ["start" if start == "n-minus-seq" else "raw"],
                                      name="start"))
    if start == "clamped":
        nodes.append(helper.make_node("Max", ["raw", "zero"], ["start"], name="clamp"))
    nodes += [helper.make_node("Slice", ["table", "start", "end", "axis1"], ["bias"], name="alibi"),
              helper.make_node("Add", ["scores", "bias"], ["y"], name="add")]
    inits = [numpy_helper.from_array(table, "table"), _ints("n", [128]), _ints("zero", [0]), _ints("end", [END]),
             _ints("axis1", [1])]
    m = _model(nodes, [_vi("scores", TP.FLOAT, ["batch", 4, "seq"])], [_vi("y", TP.FLOAT, ["batch", 4, "seq"])],
               inits)
    return m, table


@pytest.mark.parametrize("start", ["n-minus-seq", "minus-seq", "clamped"])
def test_computed_slice_bounds_narrow_the_input_range(start):
    m, table = _alibi_model(start)
    mod = load_onnx(m)
    assert _main_out_shape(mod) == ["batch", "4", "seq"]
    assert shape_bounds(mod)["seq"] == (1, 128)  # the table's length: only then is 128 - seq a start
    model = CompiledModel.from_module(mod, fuse=False)
    for seq in (1, 9, 128):
        s = np.random.default_rng(seq).standard_normal((2, 4, seq)).astype(np.float32)
        np.testing.assert_allclose(model.run({"scores": s})["y"], s + table[:, 128 - seq:], rtol=1e-6)
    with pytest.raises(InputError, match=r"dim 2 \(seq\) is 129, outside the range .* \(1\.\.128\)"):
        model.run({"scores": np.zeros((1, 4, 129), np.float32)})


def test_a_max_shape_wider_than_the_slices_allow_is_refused():
    m, _ = _alibi_model("n-minus-seq")
    with pytest.raises(InputError, match=r"max shapes give seq <= 512, but the model only reads seq <= 128 in range "
                                         r"\(node 'alibi' slices axis 1"):
        load_onnx(m, max_shapes={"scores": [2, 4, 512]})
    assert shape_bounds(load_onnx(m, max_shapes={"scores": [2, 4, 100]}))["seq"] == (1, 100)


def test_bounds_computed_from_two_dims_keep_onnx_clamps(run_ort):
    """``start = seq - batch`` is a start for some (batch, seq) and a count from the end for others: no single
    dim's range decides it, so the slice keeps ONNX's reading for every size (no range narrowed)."""
    nodes = [helper.make_node("Shape", ["x"], ["b"], start=0, end=1, name="b"),
             helper.make_node("Shape", ["x"], ["s"], start=1, end=2, name="s"),
             helper.make_node("Sub", ["s", "b"], ["start"], name="start"),
             helper.make_node("Slice", ["x", "start", "end", "axis1"], ["y"], name="odd")]
    m = _model(nodes, [_vi("x", TP.FLOAT, ["batch", "seq", 4])], [_vi("y", TP.FLOAT, ["batch", None, 4])],
               [_ints("end", [END]), _ints("axis1", [1])])
    mod = load_onnx(m)
    assert shape_bounds(mod) == {"batch": (1, 64), "seq": (1, 512)}
    model = CompiledModel.from_module(mod, fuse=False)
    for batch, seq in ((1, 5), (3, 2), (2, 7), (4, 4)):  # starts 4, -1 (from the end), 5, 0
        x = _x(batch, seq)
        got = model.run({"x": x})["y"]
        np.testing.assert_array_equal(got, run_ort(m, {"x": x})[0])
        np.testing.assert_array_equal(got, x[:, seq - batch:])


def test_reverse_slice_with_computed_bounds_is_refused_in_one_line():
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=1, end=2, name="s"),
             helper.make_node("Slice", ["x", "s", "zero", "axis1", "minus1"], ["y"], name="reverse")]
    m = _model(nodes, [_vi("x", TP.FLOAT, ["batch", "seq", 4])], [_vi("y", TP.FLOAT, ["batch", None, 4])],
               [_ints("zero", [0]), _ints("axis1", [1]), _ints("minus1", [-1])])
    with pytest.raises(ModelLoadError, match=r"op 'Slice' \(node 'reverse'\) is not supported: a slice with a "
                                             r"computed bound and step \[-1\]") as err:
        load_onnx(m)
    assert "\n" not in str(err.value)


# ---- a dim computed from the input: wav2vec2's positional-conv trim -----------------------------------------

def _conv_trim_model():
    """``conv(x)[..., :-1] + conv(x)[..., 1:]`` with a kernel of 3 and no padding: both slices are of a dim of
    ``seq - 2``, in range once that dim has an element (seq >= 3)."""
    w = np.random.default_rng(5).standard_normal((2, 2, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Slice", ["c", "zero", "minus1", "axis2"], ["head"], name="trim"),
             helper.make_node("Slice", ["c", "one", "end", "axis2"], ["tail"], name="shift"),
             helper.make_node("Add", ["head", "tail"], ["y"], name="add")]
    inits = [numpy_helper.from_array(w, "w"), _ints("zero", [0]), _ints("minus1", [-1]), _ints("one", [1]),
             _ints("end", [END]), _ints("axis2", [2])]
    m = _model(nodes, [_vi("x", TP.FLOAT, ["batch", 2, "seq"])], [_vi("y", TP.FLOAT, ["batch", 2, None])], inits)
    return m


def test_slice_of_a_computed_dim_narrows_the_lower_bound(run_ort, tmp_path):
    from tvm_fusion_ext.compile import compile_artifact
    from tvm_fusion_ext.deploy import load

    m = _conv_trim_model()
    mod = load_onnx(m)
    assert _main_out_shape(mod) == ["batch", "2", "seq - 3"]
    assert shape_bounds(mod)["seq"] == (3, 512)
    model = CompiledModel.from_module(mod, fuse=False)
    for seq in (3, 4, 11):
        x = np.random.default_rng(seq).standard_normal((2, 2, seq)).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"], run_ort(m, {"x": x})[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(InputError, match=r"dim 2 \(seq\) is 2, outside the range the model was compiled for "
                                         r"\(3\.\.512\)"):
        model.run({"x": np.zeros((1, 2, 2), np.float32)})
    # the artifact carries the narrowed range, and its loader refuses the same input
    path = tmp_path / "trim.onnx"
    path.write_bytes(m.SerializeToString())
    compile_artifact(str(path), str(tmp_path / "art"), fuse_graph=False)
    deployed = load(str(tmp_path / "art"))
    seq = deployed.manifest["dims"]["seq"]
    assert (seq["min"], seq["max"]) == (3, 512)
    # why each bound is what it is: the trim raised the lower one, the upper is the default
    assert seq["why"]["min"] == "node 'trim' slices axis 2 (seq - 2) from 0 to -1", seq
    assert seq["why"]["max"] == "default for a sequence dim; --max-shape sets one", seq
    with pytest.raises(InputError, match=r"\(3\.\.512\)"):
        deployed.run({"x": np.zeros((1, 2, 2), np.float32)})


# ---- the input ranges themselves ------------------------------------------------------------------------------

def test_dim_ranges_narrow_one_side_and_give_up_on_two_dims():
    from tvm import tirx

    from tvm_fusion_ext.frontend.dims import DimRanges

    seq, batch = tirx.Var("seq", "int64"), tirx.Var("batch", "int64")
    r = DimRanges({"seq": seq, "batch": batch}, {"batch": 8})
    assert r.require(seq >= 1, "always") and r.narrowed_upper() == {} and r.narrowed_lower() == {}
    assert r.require(128 - seq >= 0, "table")
    assert (r.lower["seq"], r.upper["seq"]) == (1, 128) and r.reasons["seq"] == {"upper": "table"}
    saved = r.save()
    assert r.require(tirx.floordiv(seq, 10) - 1 >= 0, "conv")
    assert (r.lower["seq"], r.upper["seq"]) == (10, 128) and r.narrowed_lower() == {"seq": 10}
    r.restore(saved)
    assert (r.lower["seq"], r.upper["seq"]) == (1, 128)
    assert not r.require(seq - batch >= 0, "two dims")
    assert not r.require(seq - 300 >= 0, "beyond the range")  # would need seq >= 300 > 128: nothing narrowed
    assert (r.lower["seq"], r.upper["seq"], r.upper["batch"]) == (1, 128, 8)


# ---- BEiT's interpolated relative positions: sizes as bare scalars beside tensors -----------------------------

def test_size_scalar_added_to_a_constant_vector_and_expanded(run_ort):
    """``Range(0, 5) + Shape(x)[1]`` and ``Expand(Shape(x)[1], [])``: TVM keeps the gathered size as a bare scalar
    and its Add folds the pair with numpy, then takes ``.item()`` of five elements; its Expand reads a shape off
    the scalar. Both with a static and a symbolic dim, and ``Concat(Shape(x), Shape(x)[3:])`` (an empty slice of a
    shape) as a Reshape target."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Gather", ["shape", "idx1"], ["n"], axis=0, name="n"),
             helper.make_node("Add", ["positions", "n"], ["shifted"], name="shift"),
             helper.make_node("Expand", ["n", "scalar"], ["n0"], name="n0"),
             helper.make_node("Add", ["shifted", "n0"], ["both"], name="both"),
             helper.make_node("Slice", ["shape", "three", "end"], ["rest"], name="rest"),
             helper.make_node("Concat", ["shape", "rest"], ["target"], axis=0, name="target"),
             helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape")]
    inits = [_ints("idx1", 1), _ints("positions", np.arange(5)), _ints("scalar", np.zeros((0,), np.int64)),
             _ints("three", [3]), _ints("end", [END])]
    for seq_dim in (6, "seq"):
        m = _model(nodes, [_vi("x", TP.FLOAT, ["batch", seq_dim, 4])],
                   [_vi("both", TP.INT64, [5]), _vi("y", TP.FLOAT, ["batch", seq_dim, 4])], inits)
        model = CompiledModel.from_module(load_onnx(m), fuse=False)
        x = _x(2, 6)
        got, ref = model.run({"x": x}), run_ort(m, {"x": x})
        np.testing.assert_array_equal(got["both"], ref[0])
        np.testing.assert_array_equal(got["both"], np.arange(5) + 12)
        np.testing.assert_array_equal(got["y"], x)


# ---- sizes divided: ONNX's truncating Div in the floor form TVM's analyzer reasons about ----------------------

@pytest.mark.parametrize("size_as", ["scalar", "vector"])
def test_size_divided_for_a_reshape_target_matches_a_pooled_length(run_ort, size_as):
    """``x.view(b, c, seq // 2, 2).sum(-1) + maxpool(x, 2)``: the view's length is ``Div(seq, 2)`` (truncating),
    the pool's ``seq // 2`` (TVM's floor form); for a size they are the same, and the Add needs them proven so.
    The size reaches ``Div`` as a bare scalar (``Gather`` of ``Shape``, dynamo's ``sym_size``) or as a one-element
    tensor (``Shape(x)[2:3]``, legacy exports)."""
    if size_as == "scalar":
        size = [helper.make_node("Gather", ["shape", "two"], ["n"], axis=0, name="n"),
                helper.make_node("Div", ["n", "two"], ["half0"], name="half"),
                helper.make_node("Unsqueeze", ["half0", "zero"], ["half"], name="unsq")]
    else:
        size = [helper.make_node("Slice", ["shape", "two1", "three1"], ["n"], name="n"),
                helper.make_node("Div", ["n", "two1"], ["half"], name="half")]
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Slice", ["shape", "zero1", "two1"], ["bc"], name="bc"),
             *size,
             helper.make_node("Concat", ["bc", "half", "two1"], ["target"], axis=0, name="target"),
             helper.make_node("Reshape", ["x", "target"], ["pairs"], name="view"),
             helper.make_node("ReduceSum", ["pairs", "minus1"], ["summed"], keepdims=0, name="sum"),
             helper.make_node("MaxPool", ["x"], ["pooled"], kernel_shape=[2], strides=[2], name="pool"),
             helper.make_node("Add", ["summed", "pooled"], ["y"], name="add")]
    inits = [_ints("two", 2), _ints("zero", [0]), _ints("two1", [2]), _ints("three1", [3]), _ints("zero1", [0]),
             _ints("minus1", [-1])]
    m = _model(nodes, [_vi("x", TP.FLOAT, ["batch", 3, "seq"])], [_vi("y", TP.FLOAT, ["batch", 3, None])], inits)
    mod = load_onnx(m)
    assert _main_out_shape(mod) == ["batch", "3", "seq // 2"]
    model = CompiledModel.from_module(mod, fuse=False)
    for seq in (2, 10):
        x = np.random.default_rng(seq).standard_normal((2, 3, seq)).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"], run_ort(m, {"x": x})[0], rtol=1e-6, atol=1e-6)


def test_reshape_minus_one_cancels_the_symbolic_dims_it_shares(run_ort):
    """``conv(x).reshape(-1, L, 2)`` with ``L = seq - 2`` the conv's length: TVM infers the ``-1`` as
    ``batch·4·L // (2·seq - 4)`` (it multiplies ``2·L`` out, and L could be 0 for all it knows), a quotient a later
    pass fails on (wav2vec2's dynamo export); the importer cancels the shared ``L`` (dims are at least 1) and keeps
    the ``0`` of ``allowzero=0``."""
    w = np.random.default_rng(2).standard_normal((4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Shape", ["c"], ["cs"], start=2, end=3, name="len"),
             helper.make_node("Concat", ["minus1", "cs", "two"], ["target"], axis=0, name="target"),
             helper.make_node("Reshape", ["c", "target"], ["flat"], name="flat"),
             helper.make_node("Reshape", ["flat", "keep"], ["y"], name="keep")]
    inits = [numpy_helper.from_array(w, "w"), _ints("minus1", [-1]), _ints("two", [2]), _ints("keep", [0, -1, 2])]
    m = _model(nodes, [_vi("x", TP.FLOAT, ["batch", 3, "seq"])], [_vi("y", TP.FLOAT, [None, None, 2])], inits)
    mod = load_onnx(m)
    assert _main_out_shape(mod) == ["batch * 2", "seq - 2", "2"]
    model = CompiledModel.from_module(mod, fuse=False)
    for batch, seq in ((1, 3), (2, 9)):
        x = np.random.default_rng(seq).standard_normal((batch, 3, seq)).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"], run_ort(m, {"x": x})[0], rtol=1e-5, atol=1e-5)
