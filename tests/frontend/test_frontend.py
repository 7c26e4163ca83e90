"""ONNX frontend: real exports and the tiny encoder import and match ONNX Runtime; user errors are one line."""

from __future__ import annotations

import os
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tvm_fusion_ext.errors import InputError, ModelLoadError
from tvm_fusion_ext.frontend import input_names, input_specs, load_onnx, output_names, parse_shape_arg
from tvm_fusion_ext.models import build_encoder_onnx, sample_inputs

BERT_INPUTS = ["input_ids", "attention_mask", "token_type_ids"]


def _model(nodes, inputs, outputs, inits=(), opset=17, name="g"):
    m = helper.make_model(helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8  # onnx 1.23 writes IR 14 by default, newer than onnxruntime reads
    return m


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _load_error(model, match, cls=ModelLoadError, **kw):
    with pytest.raises(cls) as info:
        load_onnx(model, **kw)
    msg = str(info.value)
    assert "\n" not in msg
    for part in ([match] if isinstance(match, str) else match):
        assert part in msg, msg
    return msg


# ---------------------------------------------------------------------------------------------------------------
# real exports
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_minilm_exports_import_and_match_ort(minilm_export, run_llvm, run_ort, exporter, attn):
    path = minilm_export(exporter, attn, seq=16)
    mod = load_onnx(path)
    assert input_names(mod) == BERT_INPUTS
    assert output_names(mod) == ["last_hidden_state"]
    assert input_specs(mod) == {n: ((1, 16), "int64") for n in BERT_INPUTS}
    feeds = sample_inputs(path, seed=3)
    assert feeds["attention_mask"][0, -1] == 0  # padding exercised
    (got,) = run_llvm(mod, feeds)
    (ref,) = run_ort(path, feeds)
    assert got.shape == (1, 16, 384)
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_legacy_export_needs_constant_of_shape_fix_and_matches_torch(minilm_export, run_llvm):
    torch = pytest.importorskip("torch")
    from tvm_fusion_ext.models import hf_model

    path = minilm_export("legacy", "sdpa", seq=16)
    proto = onnx.load(path)
    # The graph really contains the scalar-result ConstantOfShape that stock TVM 0.27 refuses.
    inits = {n.output[0]: n for n in proto.graph.node if n.op_type == "Constant"}
    scalar_cos = [n for n in proto.graph.node if n.op_type == "ConstantOfShape" and n.input[0] in inits
                  and numpy_helper.to_array(inits[n.input[0]].attribute[0].t).size == 0]
    assert scalar_cos
    mod = load_onnx(proto)  # ModelProto input works as well as a path
    feeds = sample_inputs(path, seed=5)
    module, _ = hf_model("minilm", attn="sdpa")
    with torch.no_grad():
        ref = module(*[torch.from_numpy(feeds[n]) for n in BERT_INPUTS]).numpy()
    (got,) = run_llvm(mod, feeds)
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_dynamo_export_missing_or_truncated_external_data(minilm_export, tmp_path):
    src = minilm_export("dynamo", "eager", seq=16)
    lone = tmp_path / "lone.onnx"
    shutil.copy(src, lone)  # without its .data file
    data_name = os.path.basename(src) + ".data"
    _load_error(lone, [str(lone), data_name, "not found"])
    data = open(src + ".data", "rb").read()
    with open(tmp_path / data_name, "wb") as f:
        f.write(data[: len(data) // 2])
    _load_error(lone, [str(lone), data_name, "truncated"])
    # A ModelProto read without its external data cannot be imported either: say so.
    _load_error(onnx.load(src, load_external_data=False), ["external file", "pass the model's file path"])


# ---------------------------------------------------------------------------------------------------------------
# tiny encoder
# ---------------------------------------------------------------------------------------------------------------
def test_tiny_encoder_path_and_proto_import_equal(tiny_encoder_path, run_llvm, run_ort):
    mod = load_onnx(tiny_encoder_path)
    mod_p = load_onnx(onnx.load(tiny_encoder_path))
    assert input_names(mod) == input_names(mod_p) == ["input_ids", "attention_mask"]
    assert output_names(mod) == ["last_hidden_state"]
    import tvm

    tvm.ir.assert_structural_equal(mod["main"], mod_p["main"])
    feeds = sample_inputs(tiny_encoder_path, seed=1)
    (got,) = run_llvm(mod, feeds)
    (ref,) = run_ort(tiny_encoder_path, feeds)
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# ConstantOfShape fix, checked against the ONNX reference implementation
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [[], [3], [2, 3]])
@pytest.mark.parametrize("value", [None, np.array([2.5], np.float32), np.array([True]), np.array([7], np.int64)])
def test_constant_of_shape_constant_shapes(run_llvm, shape, value):
    attrs = {} if value is None else {"value": numpy_helper.from_array(value)}
    elem = TP.FLOAT if value is None else helper.np_dtype_to_tensor_dtype(value.dtype)
    out_elem = TP.FLOAT if elem == TP.BOOL else elem
    nodes = [helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(np.array(shape, np.int64))),
             helper.make_node("ConstantOfShape", ["s"], ["c"], name="cos", **attrs)]
    if elem == TP.BOOL:
        nodes.append(helper.make_node("Cast", ["c"], ["c2"], to=TP.FLOAT))
        nodes.append(helper.make_node("Add", ["x", "c2"], ["y"]))
    else:
        nodes.append(helper.make_node("Cast", ["x"], ["xc"], to=elem))
        nodes.append(helper.make_node("Add", ["xc", "c"], ["y"]))
    m = _model(nodes, [_vi("x", TP.FLOAT, [2, 3])], [_vi("y", out_elem, [2, 3])])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (ref,) = ReferenceEvaluator(m).run(None, {"x": x})
    (got,) = run_llvm(load_onnx(m), {"x": x})
    np.testing.assert_array_equal(got, ref)


def test_constant_of_shape_from_shape_op(run_llvm):
    # Shape of an input (static after import) feeding ConstantOfShape, as legacy exports build masks.
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["c"],
                              value=numpy_helper.from_array(np.array([1.5], np.float32))),
             helper.make_node("Mul", ["x", "c"], ["y"])]
    m = _model(nodes, [_vi("x", TP.FLOAT, ["n", 4])], [_vi("y", TP.FLOAT, ["n", 4])])
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    (ref,) = ReferenceEvaluator(m).run(None, {"x": x})
    (got,) = run_llvm(load_onnx(m, shapes={"x": [3, 4]}), {"x": x})
    np.testing.assert_allclose(got, ref, rtol=1e-6)


def test_fix_is_scoped_stock_importer_untouched():
    from tvm.relax.frontend.onnx import from_onnx, onnx_frontend

    load_onnx(build_encoder_onnx(num_layers=1))
    assert onnx_frontend._get_convert_map()["ConstantOfShape"] is onnx_frontend.ConstantOfShape
    m = _model([helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(np.zeros(0, np.int64))),
                helper.make_node("ConstantOfShape", ["s"], ["y"],
                                 value=numpy_helper.from_array(np.ones(1, np.float32)))],
               [], [_vi("y", TP.FLOAT, [])])
    with pytest.raises(Exception, match="broadcast_to"):
        from_onnx(m)  # the stock importer still has its bug: we did not patch TVM
    assert load_onnx(m)["main"] is not None


# ---------------------------------------------------------------------------------------------------------------
# shapes, names, unused inputs
# ---------------------------------------------------------------------------------------------------------------
def _dynamic_model(dim=("batch", "seq")):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             helper.make_node("Softmax", ["h"], ["y"], name="sm", axis=-1)]
    return _model(nodes, [_vi("x", TP.FLOAT, [dim[0], dim[1], 8])], [_vi("y", TP.FLOAT, [dim[0], dim[1], 8])], [w])


def test_dynamic_dims_import_symbolic(run_ort):
    """Dynamic dims stay symbolic (one variable per dim_param), bounded; one build serves every size."""
    from tvm_fusion_ext.frontend.dims import shape_bounds
    from tvm_fusion_ext.runtime import CompiledModel

    m = _dynamic_model()
    mod = load_onnx(m)
    assert input_specs(mod) == {"x": (("batch", "seq", 8), "float32")}
    assert shape_bounds(mod) == {"batch": (1, 64), "seq": (1, 512)}  # leading axis: a batch; others: a sequence
    model = CompiledModel.from_module(mod, fuse=False)
    for shape in ((2, 5, 8), (1, 17, 8)):
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"], run_ort(m, {"x": x})[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match=r"input 'x' dim 1 \(seq\) is 600, outside the range .* \(1\.\.512\)"):
        model.run({"x": np.zeros((1, 600, 8), np.float32)})
    # shapes= still pins dims for a static build
    assert input_specs(load_onnx(m, shapes={"x": [2, 5, 8]})) == {"x": ((2, 5, 8), "float32")}


def test_dynamic_dim_names_and_bounds():
    from tvm_fusion_ext.frontend.dims import shape_bounds

    # dim_value 0 / absent is as dynamic as a named one, and gets its own variable
    mod = load_onnx(_dynamic_model(dim=(1, None)))
    assert input_specs(mod) == {"x": ((1, "x_dim1", 8), "float32")}
    mod = load_onnx(_dynamic_model(dim=("batch size", "seq")), max_shapes={"x": [4, 256, 8]})
    assert shape_bounds(mod) == {"batch_size": (1, 4), "seq": (1, 256)}
    m = _dynamic_model()
    _load_error(m, ["max shapes name unknown input 'y'"], InputError, max_shapes={"y": [1, 2, 8]})
    _load_error(m, ["input 'x' dim 2 is fixed to 8", "max shape gives 9"], InputError, max_shapes={"x": [1, 2, 9]})
    _load_error(m, ["rank 2", "input 'x'"], InputError, max_shapes={"x": [1, 2]})
    _load_error(_dynamic_model(dim=(1, 4)), "no input dim is dynamic", InputError, max_shapes={"x": [1, 4, 8]})


def _learned_positions_model(table_rows, offset=0, scale=1, clamp=False):
    """``input_ids (batch, seq)`` → token embedding + a position embedding gathered at ``arange(0, seq) * scale +
    offset`` from a table of ``table_rows`` (GPT-2's ``wpe``; BART shifts its positions by 2)."""
    rng = np.random.default_rng(0)
    wte = numpy_helper.from_array(rng.standard_normal((50, 8)).astype(np.float32), "wte")
    wpe = numpy_helper.from_array(rng.standard_normal((table_rows, 8)).astype(np.float32), "wpe")
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("zero", 0), ("one", 1), ("off", offset), ("scale", scale), ("rows", table_rows))]
    nodes = [helper.make_node("Shape", ["input_ids"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
             helper.make_node("Range", ["zero", "seq", "one"], ["r"]),
             helper.make_node("Mul", ["r", "scale"], ["rs"]),
             helper.make_node("Add", ["rs", "off"], ["pos0"]),
             # a clamp written as where(p < rows, p, 0): positions past the table read row 0
             *([helper.make_node("Less", ["pos0", "rows"], ["inside"]),
                helper.make_node("Where", ["inside", "pos0", "zero"], ["pos"])] if clamp else
               [helper.make_node("Identity", ["pos0"], ["pos"])]),
             helper.make_node("Unsqueeze", ["pos", "zero_axis"], ["pos2"]),
             helper.make_node("Gather", ["wte", "input_ids"], ["tok"], axis=0),
             helper.make_node("Gather", ["wpe", "pos2"], ["p"], axis=0),
             helper.make_node("Add", ["tok", "p"], ["y"])]
    consts.append(numpy_helper.from_array(np.array([0], np.int64), "zero_axis"))
    return _model(nodes, [_vi("input_ids", TP.INT64, ["batch", "seq"])], [_vi("y", TP.FLOAT, ["batch", "seq", 8])],
                  [wte, wpe, *consts])


@pytest.mark.parametrize("offset", [0, 2])
def test_learned_position_table_bounds_the_sequence(offset, run_ort):
    """Positions gathered from a constant table (GPT-2's ``Range → Gather(wpe)``, shifted by 2 as BART's) bound the
    sequence to the table: the manifest says so, and a longer input is refused before the call (ONNX Runtime
    fails inside the Gather)."""
    from tvm_fusion_ext.frontend.dims import bound_reasons, shape_bounds
    from tvm_fusion_ext.runtime import CompiledModel

    m = _learned_positions_model(20, offset=offset)
    mod = load_onnx(m)
    assert shape_bounds(mod)["seq"] == (1, 20 - offset)
    assert "gathers rows" in bound_reasons(mod)["seq"]["upper"] and "table of 20 rows" in bound_reasons(mod)["seq"]["upper"]
    assert shape_bounds(mod)["batch"] == (1, 64)  # token ids index the vocabulary: no bound from them
    model = CompiledModel.from_module(mod)
    ids = np.random.default_rng(1).integers(0, 50, (2, 20 - offset)).astype(np.int64)
    np.testing.assert_allclose(model.run({"input_ids": ids})["y"], run_ort(m, {"input_ids": ids})[0], rtol=1e-6)
    with pytest.raises(InputError, match=rf"input 'input_ids' dim 1 \(seq\) is {21 - offset}, outside .*\(1\.\.{20 - offset}\)"):
        model.run({"input_ids": np.zeros((1, 21 - offset), np.int64)})


def test_a_constant_slice_by_the_sequence_bounds_it(run_ort):
    """BERT's ``position_ids`` buffer sliced ``[:, :seq]``: the table's length is the sequence's bound, even past the
    512 default (a 600-row table here), and the manifest says where it came from."""
    from tvm_fusion_ext.frontend.dims import bound_reasons, shape_bounds
    from tvm_fusion_ext.runtime import CompiledModel

    table = numpy_helper.from_array(np.arange(600, dtype=np.int64)[None], "position_ids")
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("one", 1), ("starts", [0]), ("axes", [1]))]
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
             helper.make_node("Unsqueeze", ["seq", "starts"], ["ends"]),
             helper.make_node("Slice", ["position_ids", "starts", "ends", "axes"], ["pos"], name="pos_slice"),
             helper.make_node("Add", ["x", "pos"], ["y"])]
    m = _model(nodes, [_vi("x", TP.INT64, ["batch", "seq"])], [_vi("y", TP.INT64, ["batch", "seq"])],
               [table, *consts])
    mod = load_onnx(m)
    assert shape_bounds(mod)["seq"] == (1, 600)
    assert bound_reasons(mod)["seq"]["upper"] == "node 'pos_slice' slices axis 1 (600) from 0 to seq"
    x = np.arange(2 * 550, dtype=np.int64).reshape(2, 550)
    np.testing.assert_array_equal(CompiledModel.from_module(mod, fuse=False).run({"x": x})["y"],
                                  run_ort(m, {"x": x})[0])


def test_positions_not_a_unit_step_from_the_dim_leave_the_default_bound():
    """Indices ``2·seq - 2`` into the table: the rule bounds only positions that run to ``seq + c``, so the default
    stands (the run-time gather check still refuses an out-of-range index)."""
    from tvm_fusion_ext.frontend.dims import DEFAULT_SEQ_BOUND, shape_bounds

    assert shape_bounds(load_onnx(_learned_positions_model(20, scale=2)))["seq"] == (1, DEFAULT_SEQ_BOUND)


def test_positions_clamped_to_the_table_leave_the_sequence_unbounded(run_ort):
    """``where(p < rows, p, 0)`` keeps every index inside the table, so a longer input is valid: the position rule
    must not bound the sequence by the table (the largest index is not reached), and a 25-token input runs as in
    ONNX Runtime."""
    from tvm_fusion_ext.frontend.dims import DEFAULT_SEQ_BOUND, shape_bounds
    from tvm_fusion_ext.runtime import CompiledModel

    m = _learned_positions_model(20, clamp=True)
    mod = load_onnx(m)
    assert shape_bounds(mod)["seq"] == (1, DEFAULT_SEQ_BOUND)
    ids = np.random.default_rng(2).integers(0, 50, (1, 25)).astype(np.int64)
    np.testing.assert_allclose(CompiledModel.from_module(mod).run({"input_ids": ids})["y"],
                               run_ort(m, {"input_ids": ids})[0], rtol=1e-6)


def test_shapes_argument_errors():
    m = _dynamic_model(dim=(1, "seq"))
    _load_error(m, ["unknown input 'y'", "model inputs are: x"], InputError, shapes={"y": [1, 2, 8]})
    _load_error(m, ["rank 2", "input 'x'", "rank 3"], InputError, shapes={"x": [1, 4]})
    _load_error(m, ["input 'x' dim 0 is fixed to 1", "gives 2"], InputError, shapes={"x": [2, 4, 8]})
    _load_error(m, ["invalid dimension", "input 'x'"], InputError, shapes={"x": [1, 0, 8]})
    _load_error(m, "dtypes names unknown input 'q'", InputError, shapes={"x": [1, 4, 8]}, dtypes={"q": "float32"})


def test_pinning_one_input_pins_the_dims_it_names_everywhere(run_ort):
    """``shapes`` for one input fixes its named dims in every input that names them alike (the model says they are
    equal): pinning ``x`` to 2 × 5 makes ``m``'s ``batch, seq`` 2 × 5 too, where left symbolic the graph mixed a
    pinned and a symbolic size (an internal error in TVM's importer). Two pins of one name must agree."""
    from tvm_fusion_ext.runtime import CompiledModel

    nodes = [helper.make_node("Cast", ["m"], ["mf"], to=TP.FLOAT),
             helper.make_node("Unsqueeze", ["mf", "axis"], ["m3"]),
             helper.make_node("Mul", ["x", "m3"], ["y"])]
    axis = numpy_helper.from_array(np.array([2], np.int64), "axis")
    m = _model(nodes, [_vi("x", TP.FLOAT, ["batch", "seq", 8]), _vi("m", TP.INT64, ["batch", "seq"])],
               [_vi("y", TP.FLOAT, ["batch", "seq", 8])], [axis])
    mod = load_onnx(m, shapes={"x": [2, 5, 8]})
    assert input_specs(mod) == {"x": ((2, 5, 8), "float32"), "m": ((2, 5), "int64")}
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32),
             "m": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int64)}
    np.testing.assert_allclose(CompiledModel.from_module(mod, fuse=False).run(feeds)["y"], run_ort(m, feeds)[0])
    _load_error(m, ["inputs 'x' and 'm' share the dim 'seq'", "gives 5 and 4"], InputError,
                shapes={"x": [2, 5, 8], "m": [2, 4]})


def test_names_are_kept_through_sanitising(run_llvm):
    # TVM renames 'input.1' to a valid identifier; the ONNX names are kept on main.
    nodes = [helper.make_node("Add", ["input.1", "0bias"], ["out.0"], name="add")]
    m = _model(nodes, [_vi("input.1", TP.FLOAT, [2]), _vi("0bias", TP.FLOAT, [2])], [_vi("out.0", TP.FLOAT, [2])])
    mod = load_onnx(m)
    assert [p.name for p in mod["main"].params] != ["input.1", "0bias"]
    assert input_names(mod) == ["input.1", "0bias"]
    assert output_names(mod) == ["out.0"]
    (got,) = run_llvm(mod, {"0bias": np.array([10, 20], np.float32), "input.1": np.array([1, 2], np.float32)})
    np.testing.assert_array_equal(got, [11, 22])


def test_unused_input_stays_a_parameter(run_llvm):
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="r"), helper.make_node("Neg", ["x"], ["z"], name="n")]
    m = _model(nodes, [_vi("x", TP.FLOAT, [3]), _vi("token_type_ids", TP.INT64, [1, 3])],
               [_vi("y", TP.FLOAT, [3]), _vi("z", TP.FLOAT, [3])])
    mod = load_onnx(m)
    assert input_names(mod) == ["x", "token_type_ids"]
    assert output_names(mod) == ["y", "z"]
    x = np.array([-1, 0, 2], np.float32)
    y, z = run_llvm(mod, {"x": x, "token_type_ids": np.zeros((1, 3), np.int64)})
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    np.testing.assert_array_equal(z, -x)


def test_names_fall_back_for_modules_not_imported_here():
    import tvm
    from tvm import relax

    x = relax.Var("x", relax.TensorType((2,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.negative(x)))
    mod = bb.get()
    assert isinstance(mod, tvm.IRModule)
    assert input_names(mod) == ["x"] and output_names(mod) == ["output_0"]


# ---------------------------------------------------------------------------------------------------------------
# file and op errors
# ---------------------------------------------------------------------------------------------------------------
def test_missing_file_and_directory(tmp_path):
    _load_error(tmp_path / "nope.onnx", f"{tmp_path / 'nope.onnx'}: no such file")
    _load_error(tmp_path, "is a directory")
    _load_error(12, "expected an ONNX file path or onnx.ModelProto")


@pytest.mark.parametrize("content", ["truncated", "text", "empty"])
def test_unreadable_files(tmp_path, content):
    good = build_encoder_onnx(num_layers=1).SerializeToString()
    data = {"truncated": good[: len(good) // 2], "text": b"hello, I am not a model\n", "empty": b""}[content]
    p = tmp_path / "bad.onnx"
    p.write_bytes(data)
    msg = _load_error(p, str(p))
    assert "ONNX model" in msg


def test_unsupported_op_named_before_import():
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="ok"),
             helper.make_node("FancyOp", ["h"], ["y"], name="layer0/fancy"),
             helper.make_node("OtherOp", ["y"], ["z"], name="layer1/other")]
    m = _model(nodes, [_vi("x", TP.FLOAT, [2])], [_vi("z", TP.FLOAT, [2])])
    _load_error(m, ["op 'FancyOp' (node 'layer0/fancy') is not supported", "1 more", "OtherOp"])
    ms = helper.make_node("FusedMatMulX", ["x", "x"], ["y"], name="ms_node", domain="com.microsoft")
    m2 = _model([ms], [_vi("x", TP.FLOAT, [2, 2])], [_vi("y", TP.FLOAT, [2, 2])])
    m2.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    _load_error(m2, "op 'com.microsoft.FusedMatMulX' (node 'ms_node')")


def test_conversion_error_names_node():
    # TVM's converter fails on it (the reduction dims differ), and the file breaks ONNX's own shape rules: the
    # error gives ONNX's verdict, which names the node and the cause, not TVM's symptom
    nodes = [helper.make_node("MatMul", ["a", "b"], ["c"], name="encoder/bad_matmul")]
    m = _model(nodes, [_vi("a", TP.FLOAT, [2, 3]), _vi("b", TP.FLOAT, [4, 5])], [_vi("c", TP.FLOAT, [2, 5])])
    _load_error(m, ["not a valid ONNX model", "op_type:MatMul, node name: encoder/bad_matmul",
                    "Incompatible dimensions"])


EVAL_EXPORT = ("export the model in eval mode (model.eval()) or with "
               "torch.onnx.export(..., training=torch.onnx.TrainingMode.EVAL)")


@pytest.mark.parametrize("mode", ["constant", "computed"])
def test_training_mode_dropout_is_refused_with_how_to_export_for_inference(mode):
    # a torch module exported without .eval() keeps Dropout's training form: refused, and the line says how to
    # export it for inference instead
    x, y = _vi("x", TP.FLOAT, [2, 3]), _vi("y", TP.FLOAT, [2, 3])
    node = helper.make_node("Dropout", ["x", "ratio", "training"], ["y"], name="encoder/dropout")
    ratio = numpy_helper.from_array(np.array(0.1, np.float32), "ratio")
    if mode == "constant":
        m = _model([node], [x], [y], inits=[ratio, numpy_helper.from_array(np.array(True), "training")])
        reason = "training_mode=true (random dropout) is not supported"
    else:
        m = _model([node], [x, _vi("training", TP.BOOL, [])], [y], inits=[ratio])
        reason = "training_mode input 'training' is computed at run time"
    _load_error(m, ["op 'Dropout' (node 'encoder/dropout') is not supported", reason, EVAL_EXPORT])


def test_training_mode_batchnorm_is_refused_with_how_to_export_for_inference():
    c = 3
    stats = [numpy_helper.from_array(np.ones(c, np.float32), n) for n in ("scale", "bias", "mean", "var")]
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y", "m", "v"],
                            name="bn", training_mode=1)
    m = _model([node], [_vi("x", TP.FLOAT, [2, c, 4])], [_vi("y", TP.FLOAT, [2, c, 4])], inits=stats)
    _load_error(m, ["op 'BatchNormalization' (node 'bn') is not supported", "training_mode=1", EVAL_EXPORT])


def test_dropout_at_inference_imports(run_llvm):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    node = helper.make_node("Dropout", ["x", "ratio", "training"], ["y"])
    inits = [numpy_helper.from_array(np.array(0.1, np.float32), "ratio"),
             numpy_helper.from_array(np.array(False), "training")]
    m = _model([node], [_vi("x", TP.FLOAT, [2, 3])], [_vi("y", TP.FLOAT, [2, 3])], inits=inits)
    np.testing.assert_array_equal(run_llvm(load_onnx(m), {"x": x})[0], x)


# ---------------------------------------------------------------------------------------------------------------
# CLI shape argument
# ---------------------------------------------------------------------------------------------------------------
def test_parse_shape_arg():
    assert parse_shape_arg("input_ids:1x128,attention_mask:1x128") == {"input_ids": [1, 128],
                                                                       "attention_mask": [1, 128]}
    assert parse_shape_arg(" x.1 : 2 x 3 x 4 ") == {"x.1": [2, 3, 4]}
    assert parse_shape_arg("x:7") == {"x": [7]}
    # a 0 parses (a past length's first step); load_onnx refuses it for any other dim
    assert parse_shape_arg("past:1x2x0x16") == {"past": [1, 2, 0, 16]}
    for bad in ["", "input_ids", "input_ids:", "input_ids:1x", "a:1,a:2", "a:1xb", ":1x2"]:
        with pytest.raises(InputError) as info:
            parse_shape_arg(bad)
        assert "\n" not in str(info.value)


def test_initializers_listed_as_inputs_are_weights_not_inputs(run_llvm):
    # Old exporters (keep_initializers_as_inputs=True) list every weight in graph.input.
    w = numpy_helper.from_array(np.array([1, 2, 3], np.float32), "w")
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", TP.FLOAT, [3]), _vi("w", TP.FLOAT, [3])],
               [_vi("y", TP.FLOAT, [3])], [w])
    mod = load_onnx(m)
    assert input_names(mod) == ["x"]
    np.testing.assert_array_equal(run_llvm(mod, {"x": np.ones(3, np.float32)})[0], [2, 3, 4])


def test_unknown_rank_and_non_tensor_inputs():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, None)], [_vi("y", TP.FLOAT, None)])
    _load_error(m, "input 'x' has unknown rank; pass shapes=")
    assert input_names(load_onnx(m, shapes={"x": [2, 2]})) == ["x"]
    seq_in = helper.make_tensor_sequence_value_info("x", TP.FLOAT, [2])
    m2 = _model(nodes, [seq_in], [_vi("y", TP.FLOAT, [2])])
    _load_error(m2, "input 'x' is not a tensor")


def _chunk_slice_model(width=7):
    """``torch.chunk`` as a legacy export spells it: the bounds of a Slice computed from ``Shape(x)[-1]``
    (``ends = (w + 1) / 2``; ``starts = (0 - w) / 2``, which truncating and flooring division tell apart), then a
    Reshape with -1 that needs the slice's shape at import."""
    c = {n: numpy_helper.from_array(np.array(v, np.int64), n)
         for n, v in (("idx", [2]), ("one", [1]), ("two", [2]), ("zero", [0]), ("axis", [2]), ("to", [2, -1]))}
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "idx"], ["w"], axis=0),
             helper.make_node("Add", ["w", "one"], ["w1"]),
             helper.make_node("Div", ["w1", "two"], ["end"]),
             helper.make_node("Sub", ["zero", "w"], ["neg_w"]),
             helper.make_node("Div", ["neg_w", "two"], ["start"]),
             helper.make_node("Slice", ["x", "zero", "end", "axis"], ["head"]),
             helper.make_node("Slice", ["x", "start", "end", "axis"], ["mid"]),  # empty unless start < end
             helper.make_node("Slice", ["x", "start", "w", "axis"], ["tail"]),
             helper.make_node("Reshape", ["head", "to"], ["y"]),
             helper.make_node("Reshape", ["tail", "to"], ["z"])]
    return _model(nodes, [_vi("x", TP.FLOAT, [2, 3, width])],
                  [_vi("y", TP.FLOAT, None), _vi("z", TP.FLOAT, None), _vi("mid", TP.FLOAT, None)],
                  inits=c.values())


@pytest.mark.parametrize("width", [6, 7])
def test_slice_bounds_computed_from_static_sizes_import_with_known_shapes(run_llvm, run_ort, width):
    m = _chunk_slice_model(width)
    mod = load_onnx(m)
    body = mod["main"].body.body
    for f in body.ty.fields:  # every output has a static shape: the bounds were folded
        assert f.shape is not None and all(isinstance(int(d), int) for d in f.shape.values), body.ty
    x = np.random.default_rng(0).standard_normal((2, 3, width)).astype(np.float32)
    for got, ref in zip(run_llvm(mod, {"x": x}), run_ort(m, {"x": x})):
        assert got.shape == ref.shape
        np.testing.assert_array_equal(got, ref)


def test_slice_bounds_read_from_data_are_not_folded(run_llvm, run_ort):
    # an end read from an input tensor is data, not a size: the slice keeps a run-time length
    nodes = [helper.make_node("Slice", ["x", "zero", "n", "axis"], ["y"])]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "axis")]
    m = _model(nodes, [_vi("x", TP.FLOAT, [2, 6]), _vi("n", TP.INT64, [1])], [_vi("y", TP.FLOAT, None)], inits)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    for n in (2, 5):
        feeds = {"x": x, "n": np.array([n], np.int64)}
        (got,), (ref,) = run_llvm(load_onnx(m), feeds), run_ort(m, feeds)
        np.testing.assert_array_equal(got, ref)


def _window_pad_model(dims):
    """Swin's pad to whole 4×4 windows as a legacy export spells ``F.pad(x, (0, 0, 0, pad_w, 0, pad_h))`` on a
    ``[N, H, W, C]`` map: each pad ``(4 - H % 4) % 4`` computed from ``Shape(x)``; the torch pad list completed with
    ``ConstantOfShape(8 - len)`` zeros, viewed as pairs, the pairs reversed (``Slice`` with step -1) and
    transposed into ONNX's begins-then-ends order."""
    c = {n: numpy_helper.from_array(np.array(v, np.int64), n)
         for n, v in (("h_at", 1), ("w_at", 2), ("four", 4), ("zero1", [0]), ("axis0", [0]), ("eight", [8]),
                      ("pairs", [-1, 2]), ("rev_start", [-1]), ("rev_end", [-(2**63 - 1)]), ("rev_step", [-1]),
                      ("flat", [-1]))}
    nodes = [helper.make_node("Shape", ["x"], ["s"])]
    for d in ("h", "w"):
        nodes += [helper.make_node("Gather", ["s", f"{d}_at"], [d], axis=0),
                  helper.make_node("Mod", [d, "four"], [f"{d}_mod"]),
                  helper.make_node("Sub", ["four", f"{d}_mod"], [f"{d}_left"]),
                  helper.make_node("Mod", [f"{d}_left", "four"], [f"pad_{d}"]),
                  helper.make_node("Unsqueeze", [f"pad_{d}", "axis0"], [f"pad_{d}1"])]
    nodes += [helper.make_node("Concat", ["zero1", "zero1", "zero1", "pad_w1", "zero1", "pad_h1"], ["torch_pads"],
                               axis=0),
              helper.make_node("Shape", ["torch_pads"], ["tp_len"]),
              helper.make_node("Sub", ["eight", "tp_len"], ["rest"]),
              helper.make_node("ConstantOfShape", ["rest"], ["zeros"],
                               value=numpy_helper.from_array(np.array([0], np.int64))),
              helper.make_node("Concat", ["torch_pads", "zeros"], ["all8"], axis=0),
              helper.make_node("Reshape", ["all8", "pairs"], ["p42"]),
              helper.make_node("Slice", ["p42", "rev_start", "rev_end", "axis0", "rev_step"], ["rev"]),
              helper.make_node("Transpose", ["rev"], ["t"], perm=[1, 0]),
              helper.make_node("Reshape", ["t", "flat"], ["pads"]),
              helper.make_node("Pad", ["x", "pads"], ["y"], mode="constant")]
    return _model(nodes, [_vi("x", TP.FLOAT, dims)], [_vi("y", TP.FLOAT, None)], inits=c.values())


@pytest.mark.parametrize("dims", [[1, 5, 6, 3], [2, 8, 3, 2]])
def test_pads_computed_from_static_sizes_import_with_known_shapes(run_llvm, run_ort, dims):
    m = _window_pad_model(dims)
    mod = load_onnx(m)
    out_ty = mod["main"].body.body.ty
    want = [dims[0], -(-dims[1] // 4) * 4, -(-dims[2] // 4) * 4, dims[3]]
    assert [int(d) for d in out_ty.shape.values] == want, out_ty
    x = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
    (got,), (ref,) = run_llvm(mod, {"x": x}), run_ort(m, {"x": x})
    assert got.shape == ref.shape == tuple(want)
    np.testing.assert_array_equal(got, ref)


def test_pads_computed_from_a_dynamic_size_pad_at_run_time(run_ort):
    # the pad widths depend on the run-time height: written as blocks of zeros sized by ``(4 - height % 4) % 4``
    # (``frontend/converters/pad.py``; refused as "Dynamic pads" before), right at every height
    from tvm_fusion_ext.runtime import CompiledModel

    m = _window_pad_model([1, "height", 6, 3])
    model = CompiledModel.from_module(load_onnx(m), fuse=False)
    for height in (1, 4, 5, 11):
        x = np.random.default_rng(height).standard_normal((1, height, 6, 3)).astype(np.float32)
        got = model.run({"x": x})[output_names(load_onnx(m))[0]]
        assert got.shape == (1, -(-height // 4) * 4, 8, 3)
        np.testing.assert_array_equal(got, run_ort(m, {"x": x})[0])


# ---------------------------------------------------------------------------------------------------------------
# sizes computed from dynamic dims (BLOOM's dynamic exports)
# ---------------------------------------------------------------------------------------------------------------
def _heads_times_batch_model(spelling):
    """BLOOM's head split and merge with sizes computed from the dynamic batch. ``dynamo``: ``batch · 2`` as a
    scalar (``Squeeze(Shape(x)[0:1]) * 2``) reshaped to one element and concatenated into the target shape;
    ``legacy``: the merged ``[batch · 2, seq, 3]`` view's first dim divided back (``(batch · 2) / 2``). A dense
    reads the merged result."""
    c = {n: numpy_helper.from_array(np.array(v, np.int64), n)
         for n, v in (("two", 2), ("m1", [-1]), ("three", [3]), ("six", [6]), ("zero", 0), ("axis0", [0]),
                      ("split", [-1, 0, 3]))}
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32), "w")
    nodes = [helper.make_node("Shape", ["x"], ["b1"], start=0, end=1),
             helper.make_node("Shape", ["x"], ["s1"], start=1, end=2)]
    if spelling == "dynamo":
        nodes += [helper.make_node("Squeeze", ["b1"], ["b"]),
                  helper.make_node("Mul", ["b", "two"], ["bh"]),
                  helper.make_node("Reshape", ["bh", "m1"], ["bh1"]),
                  helper.make_node("Concat", ["bh1", "s1", "three"], ["split_shape"], axis=0),
                  helper.make_node("Reshape", ["x", "split_shape"], ["heads"]),            # [batch·2, seq, 3]
                  helper.make_node("Concat", ["b1", "s1", "six"], ["merge_shape"], axis=0)]
    else:
        nodes += [helper.make_node("Reshape", ["x", "split"], ["heads"]),                  # [batch·2, seq, 3]
                  helper.make_node("Shape", ["heads"], ["hs"]),
                  helper.make_node("Gather", ["hs", "zero"], ["bh"], axis=0),
                  helper.make_node("Div", ["bh", "two"], ["b_again"]),                    # (batch·2) / 2
                  helper.make_node("Unsqueeze", ["b_again", "axis0"], ["b_again1"]),
                  helper.make_node("Concat", ["b_again1", "s1", "six"], ["merge_shape"], axis=0)]
    nodes += [helper.make_node("Reshape", ["heads", "merge_shape"], ["merged"]),          # [batch, seq, 6]
              helper.make_node("MatMul", ["merged", "w"], ["y"])]
    return _model(nodes, [_vi("x", TP.FLOAT, ["batch", "seq", 6])], [_vi("y", TP.FLOAT, ["batch", "seq", 5])],
                  inits=[*c.values(), w])


@pytest.mark.parametrize("spelling", ["dynamo", "legacy"])
def test_sizes_computed_from_dynamic_dims_import_and_build(run_ort, spelling):
    from tvm_fusion_ext.runtime import CompiledModel

    m = _heads_times_batch_model(spelling)
    # dynamo: the scalar batch·2 given to a Reshape was refused by TVM's importer; legacy: Div(batch·2, 2) as the
    # dense's row dim failed to build (the kernel could not bind batch from it)
    model = CompiledModel.from_module(load_onnx(m))
    for batch, seq in ((1, 1), (3, 7)):
        x = np.random.default_rng(batch).standard_normal((batch, seq, 6)).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"], run_ort(m, {"x": x})[0], rtol=1e-5, atol=1e-5)


def _flattened_rows_dense_model():
    """GPT-2's Conv1D as exported: the rows flattened (``x.view(-1, K)``), ``addmm``, the rows restored."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 12)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(12).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([-1, 8], np.int64), "flat"),
             numpy_helper.from_array(np.array([12], np.int64), "n")]
    nodes = [helper.make_node("Shape", ["x"], ["bs"], start=0, end=2),
             helper.make_node("Reshape", ["x", "flat"], ["x2"]),                  # [batch · seq, 8]
             helper.make_node("Gemm", ["x2", "w", "b"], ["y2"]),
             helper.make_node("Concat", ["bs", "n"], ["out_shape"], axis=0),
             helper.make_node("Reshape", ["y2", "out_shape"], ["y"])]
    return _model(nodes, [_vi("x", TP.FLOAT, ["batch", "seq", 8])], [_vi("y", TP.FLOAT, ["batch", "seq", 12])],
                  inits)


def test_dense_over_flattened_symbolic_rows_builds(run_ort):
    from tvm_fusion_ext.runtime import CompiledModel

    m = _flattened_rows_dense_model()
    model = CompiledModel.from_module(load_onnx(m))
    assert model.report.fused["dense"] == 1
    # the kernel's buffers are [batch · seq, ·]: batch and seq reach it as scalar arguments (it failed to build)
    for batch, seq in ((1, 1), (2, 9)):
        x = np.random.default_rng(seq).standard_normal((batch, seq, 8)).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"], run_ort(m, {"x": x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dims", [["batch", "seq", 16], [2, 3, 16]])
def test_empty_slice_builds(run_ort, dims):
    # Phi-3's legacy export keeps the rotary "pass-through" slice even when it is empty (rotary dim = head dim)
    from tvm_fusion_ext.runtime import CompiledModel

    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("s", [16]), ("e", [16]), ("ax", [2]))]
    nodes = [helper.make_node("Slice", ["x", "s", "e", "ax"], ["empty"]),
             helper.make_node("Concat", ["x", "empty"], ["y"], axis=2)]
    m = _model(nodes, [_vi("x", TP.FLOAT, dims)], [_vi("y", TP.FLOAT, dims)], inits)
    model = CompiledModel.from_module(load_onnx(m))
    x = np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32)
    np.testing.assert_array_equal(model.run({"x": x})["y"], run_ort(m, {"x": x})[0])


def test_tile_by_a_size_feeds_its_consumers(run_ort):
    # DeBERTa's dynamo export repeats its relative-position keys batch times (repeats from Shape), then permutes them;
    # TVM's own converter made an opaque kernel with fresh output dims that FuseTIR could not tie to batch
    from tvm_fusion_ext.runtime import CompiledModel

    inits = [numpy_helper.from_array(np.array([1], np.int64), "one")]
    nodes = [helper.make_node("Shape", ["x"], ["b"], start=0, end=1),
             helper.make_node("Concat", ["b", "one", "one"], ["reps"], axis=0),
             helper.make_node("Tile", ["keys", "reps"], ["tiled"]),                  # [batch · 4, 5, 3]
             helper.make_node("Transpose", ["tiled"], ["y"], perm=[0, 2, 1])]
    m = _model(nodes, [_vi("x", TP.FLOAT, ["batch", 2]), _vi("keys", TP.FLOAT, [4, 5, 3])],
               [_vi("y", TP.FLOAT, None)], inits)
    model = CompiledModel.from_module(load_onnx(m))
    keys = np.random.default_rng(0).standard_normal((4, 5, 3)).astype(np.float32)
    for batch in (1, 3):
        feeds = {"x": np.zeros((batch, 2), np.float32), "keys": keys}
        got, ref = model.run(feeds)["y"], run_ort(m, feeds)[0]
        assert got.shape == ref.shape == (batch * 4, 3, 5)
        np.testing.assert_array_equal(got, ref)


def test_expand_of_symbolic_data_to_a_constant_shape(run_ort):
    # GPT-J / CodeGen / GLM under dynamic axes: position_ids.unsqueeze(-1).repeat(1, 1, d) exports as an Expand of
    # a [batch, seq, 1] tensor to the constant [1, 1, 8]; TVM's converter read every data dim as a number
    from tvm_fusion_ext.runtime import CompiledModel

    inits = [numpy_helper.from_array(np.array([1, 1, 8], np.int64), "shape"),
             numpy_helper.from_array(np.array([2, 1, 1, 1], np.int64), "shape4")]
    nodes = [helper.make_node("Expand", ["x", "shape"], ["y"]),       # [batch, seq, 1] -> [batch, seq, 8]
             helper.make_node("Expand", ["x", "shape4"], ["z"])]      # one more axis: [2, batch, seq, 1]
    m = _model(nodes, [_vi("x", TP.FLOAT, ["batch", "seq", 1])],
               [_vi("y", TP.FLOAT, None), _vi("z", TP.FLOAT, None)], inits)
    model = CompiledModel.from_module(load_onnx(m), fuse=False)
    for shape in ((1, 3, 1), (2, 5, 1)):
        feeds = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
        got, ref = model.run(feeds), run_ort(m, feeds)
        assert got["y"].shape == ref[0].shape == (*shape[:2], 8)
        assert got["z"].shape == ref[1].shape == (2, *shape)
        np.testing.assert_array_equal(got["y"], ref[0])
        np.testing.assert_array_equal(got["z"], ref[1])


def test_expand_refuses_incompatible_static_dims():
    inits = [numpy_helper.from_array(np.array([1, 3, 8], np.int64), "shape")]
    m = _model([helper.make_node("Expand", ["x", "shape"], ["y"], name="bad_expand")],
               [_vi("x", TP.FLOAT, ["batch", 5, 1])], [_vi("y", TP.FLOAT, None)], inits)
    _load_error(m, ["bad_expand", "Expand", "cannot broadcast data dim 5 to 3 at axis 1"])


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
def test_variadic_elementwise_folds_pairwise(run_ort, op):
    # the stock converter stacked broadcast copies of every input and reduced the new axis (XGLM's score clamp
    # became a [2, B, H, S, S] tensor); folded pairwise, the result is the same and no stack is left
    import tvm
    from tvm import relax

    from tvm_fusion_ext.runtime import CompiledModel

    inits = [numpy_helper.from_array(np.array(-0.5, np.float32), "floor")]
    m = _model([helper.make_node(op, ["a", "b", "floor"], ["y"])],
               [_vi("a", TP.FLOAT, ["batch", 4, 6]), _vi("b", TP.FLOAT, [1, 1, 6])], [_vi("y", TP.FLOAT, None)],
               inits)
    mod = load_onnx(m)
    ops = set()
    tvm.relax.analysis.post_order_visit(mod["main"].body, lambda e: isinstance(e, relax.Call) and isinstance(
        e.op, tvm.ir.Op) and ops.add(e.op.name))
    assert "relax.stack" not in ops
    model = CompiledModel.from_module(mod, fuse=False)
    rng = np.random.default_rng(1)
    feeds = {"a": rng.standard_normal((3, 4, 6)).astype(np.float32),
             "b": rng.standard_normal((1, 1, 6)).astype(np.float32)}
    np.testing.assert_allclose(model.run(feeds)["y"], run_ort(m, feeds)[0], rtol=1e-6, atol=1e-6)


def test_dynamically_quantized_matmul_is_exact():
    # what onnxruntime.quantization.quantize_dynamic writes for a MatMul. Exact int32 arithmetic here; ONNX
    # Runtime's AVX2 u8s8 kernel saturates int16 partial sums (off by up to ~2e4 on this data), which is why a
    # quantized RoBERTa differs from ORT by ~5e-3 while matching an exact computation
    from tvm_fusion_ext.runtime import CompiledModel

    rng = np.random.default_rng(0)
    k, n = 64, 128
    w = rng.integers(-127, 128, (k, n)).astype(np.int8)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(0, np.int8), "wz")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["y"])]
    m = _model(nodes, [_vi("x", TP.FLOAT, ["rows", k])],
               [_vi("y", TP.INT32, None), _vi("xq", TP.UINT8, None), _vi("xz", TP.UINT8, None)], inits)
    x = (rng.standard_normal((32, k)) * 2).astype(np.float32)
    got = CompiledModel.from_module(load_onnx(m)).run({"x": x})
    scale = (max(0.0, float(x.max())) - min(0.0, float(x.min()))) / 255
    zero = int(np.clip(np.rint(-float(x.min()) / scale), 0, 255))
    xq = np.clip(np.rint(x / np.float32(scale)) + zero, 0, 255).astype(np.int64)
    assert int(got["xz"]) == zero
    assert int(np.abs(got["xq"].astype(np.int64) - xq).max()) <= 1  # scale rounding at a .5 tie
    np.testing.assert_array_equal(got["y"], (got["xq"].astype(np.int64) - zero) @ w.astype(np.int64))


@pytest.mark.parametrize("op,fill", [("ReduceMax", -np.inf), ("ReduceMin", np.inf)])
def test_reduction_of_only_infinities_is_that_infinity(run_llvm, op, fill):
    # TOPI starts max/min at the lowest/highest finite value; ONNX's expanded Attention tests a row for "every key
    # hidden" with ReduceMax(bias) == -inf, which must hold
    lowest = np.finfo(np.float32).min if fill < 0 else np.finfo(np.float32).max
    x = np.array([[fill, fill], [1.0, fill], [lowest, fill]], np.float32)
    m = _model([helper.make_node(op, ["x"], ["y"], axes=[1], keepdims=0)], [_vi("x", TP.FLOAT, [3, 2])],
               [_vi("y", TP.FLOAT, None)], opset=13)
    (got,) = run_llvm(load_onnx(m), {"x": x})
    want = x.max(axis=1) if op == "ReduceMax" else x.min(axis=1)
    np.testing.assert_array_equal(got, want)


def test_concat_of_sizes_and_tensors_computed_from_them(run_llvm, run_ort):
    # an expanded function body's Expand target: Shape slices concatenated with a Where over sizes
    c = {n: numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("one", [1]), ("two", [2]))}
    nodes = [helper.make_node("Shape", ["x"], ["b"], start=0, end=1),
             helper.make_node("Shape", ["x"], ["rest"], start=1),
             helper.make_node("Equal", ["b", "one"], ["is_one"]),
             helper.make_node("Where", ["is_one", "two", "one"], ["rep"]),
             helper.make_node("Concat", ["b", "rep", "rest"], ["target"], axis=0),
             helper.make_node("Unsqueeze", ["x", "one"], ["x1"]),
             helper.make_node("Expand", ["x1", "target"], ["y"])]
    m = _model(nodes, [_vi("x", TP.FLOAT, [1, 3, 4])], [_vi("y", TP.FLOAT, None)], inits=c.values())
    x = np.random.default_rng(0).standard_normal((1, 3, 4)).astype(np.float32)
    (got,), (ref,) = run_llvm(load_onnx(m), {"x": x}), run_ort(m, {"x": x})
    assert got.shape == ref.shape == (1, 2, 3, 4)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("dims,batches", [([1, 3], (1,)), ([2, 3], (2,)), (["batch", 3], (1, 2))])
def test_equal_of_a_size_and_a_constant_is_its_value(run_llvm, run_ort, dims, batches):
    # TVM's converter compared Shape(x)[0:1] with [1] as IR objects: always False, even for a batch of 1, and
    # for a symbolic batch whatever it is at run time
    c = numpy_helper.from_array(np.array([1], np.int64), "one")
    nodes = [helper.make_node("Shape", ["x"], ["b"], start=0, end=1),
             helper.make_node("Equal", ["b", "one"], ["y"])]
    m = _model(nodes, [_vi("x", TP.FLOAT, dims)], [_vi("y", TP.BOOL, None)], inits=[c])
    mod = load_onnx(m)
    for batch in batches:
        x = np.zeros((batch, 3), np.float32)
        (got,), (ref,) = run_llvm(mod, {"x": x}), run_ort(m, {"x": x})
        np.testing.assert_array_equal(got, ref)
        assert bool(got[0]) == (batch == 1)



def test_legacy_expand_target_keeps_its_symbolic_dims(run_llvm, run_ort):
    # torch's legacy exporter writes expand(-1, ...) as Where(Equal(Shape(x), -1), 1, Shape(x)): a size is never
    # -1, so the comparison is False at import and the target stays a shape with the input's own dims
    c = {n: numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("m1", [-1, -1]), ("ones", [1, 1]))}
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Equal", ["s", "m1"], ["keep"]),
             helper.make_node("Where", ["keep", "ones", "s"], ["target"]),
             helper.make_node("Expand", ["x", "target"], ["y"])]
    m = _model(nodes, [_vi("x", TP.FLOAT, ["batch", "seq"])], [_vi("y", TP.FLOAT, None)], inits=c.values())
    mod = load_onnx(m)
    assert [str(d) for d in mod["main"].body.body.ty.shape.values] == ["batch", "seq"]
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    (got,), (ref,) = run_llvm(mod, {"x": x}), run_ort(m, {"x": x})
    np.testing.assert_array_equal(got, ref)


def test_tvm_operator_reprs_are_named_not_dumped_in_one_line_errors():
    """TVM prints an operator as its whole registration; the one-line error keeps its name and the reason after it."""
    from tvm_fusion_ext.frontend.importer import _one_line

    err = TypeError('ir.Op(span=None, ty=ir.Type(span=None), name="relax.nn.layer_norm", description="", '
                    'arguments=(ir.ArgumentInfo(name="data", type_info="Tensor", description="Input."),), '
                    'attrs_type_key="relax.attrs.LayerNormAttrs", num_inputs=3, support_level=10) requires all the '
                    'input tensors to have the same dtype. However, the gamma has dtype T.float16')
    msg = _one_line(err)
    assert msg == ("TypeError: relax.nn.layer_norm requires all the input tensors to have the same dtype. However, "
                   "the gamma has dtype T.float16"), msg


# ---------------------------------------------------------------------------------------------------------------
# size arithmetic in floats (MobileViT's legacy export)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("unary", ["Ceil", "Floor", "Round", "Abs", "Sqrt"])
def test_float_size_arithmetic_folds_into_a_reshape_target(run_llvm, run_ort, unary):
    # int(math.ceil(h / p) * p) traced with constants: Ceil(2.0) · 2.0 → Cast(int64) → Div 2 → · 3 → Unsqueeze →
    # Concat into a Reshape target. One unary op of a constant left unfolded made the target a run-time tensor,
    # which TVM's Reshape converter refused
    c = {n: numpy_helper.from_array(np.array(v), n) for n, v in (
        ("half", np.float32(2.25)), ("two_f", np.float32(2.0)), ("two", np.int64(2)), ("three", np.int64(3)),
        ("zero", np.array([0], np.int64)), ("minus1", np.array([-1], np.int64)))}
    nodes = [helper.make_node(unary, ["half"], ["u"]),
             helper.make_node("Mul", ["u", "two_f"], ["m"]),
             helper.make_node("Cast", ["m"], ["mi"], to=TP.INT64),
             helper.make_node("Div", ["mi", "two"], ["d"]),
             helper.make_node("Mul", ["d", "three"], ["rows"]),
             helper.make_node("Unsqueeze", ["rows", "zero"], ["rows1"]),
             helper.make_node("Concat", ["rows1", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    rows = int(getattr(np, unary.lower() if unary != "Round" else "round")(2.25) * 2.0) // 2 * 3
    m = _model(nodes, [_vi("x", TP.FLOAT, [rows, 4])], [_vi("y", TP.FLOAT, None)], inits=list(c.values()))
    x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    (got,), (ref,) = run_llvm(load_onnx(m), {"x": x}), run_ort(m, {"x": x})
    assert got.shape == ref.shape == (rows, 4)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("axis,depth_dtype", [(-1, np.int64), (0, np.float32), (1, np.int64)])
def test_one_hot_with_values_computed_at_run_time(run_llvm, run_ort, axis, depth_dtype):
    # CANINE's legacy export: OneHot's [off, on] values come from the graph; TVM's converter asserted they were
    # constants (a crash). Negative indices count from depth
    depth = numpy_helper.from_array(np.array(5, depth_dtype), "depth")
    nodes = [helper.make_node("Concat", ["off", "on"], ["values"], axis=0),
             helper.make_node("OneHot", ["idx", "depth", "values"], ["y"], axis=axis)]
    m = _model(nodes, [_vi("idx", TP.INT64, [2, 3]), _vi("off", TP.FLOAT, [1]), _vi("on", TP.FLOAT, [1])],
               [_vi("y", TP.FLOAT, None)], inits=[depth])
    feeds = {"idx": np.array([[0, 4, -1], [2, -5, 3]], np.int64), "off": np.array([0.5], np.float32),
             "on": np.array([-2.0], np.float32)}
    (got,), (ref,) = run_llvm(load_onnx(m), feeds), run_ort(m, feeds)
    assert got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("op", ["Min", "Max"])
def test_variadic_op_of_a_dynamic_size_and_a_tensor(run_llvm, run_ort, op):
    # DeBERTa's dynamic export: min(seq, span) with seq read as Shape → Squeeze (a bare size to TVM's importer)
    # and span a scalar constant. The pair reached a tensor op with the bare size and crashed in legalisation
    span = numpy_helper.from_array(np.array(5, np.int64), "span")
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=1, end=2),
             helper.make_node("Squeeze", ["s"], ["seq"]),
             helper.make_node(op, ["seq", "span"], ["m"]),
             helper.make_node("Cast", ["m"], ["mf"], to=TP.FLOAT),
             helper.make_node("Add", ["x", "mf"], ["y"])]
    m = _model(nodes, [_vi("x", TP.FLOAT, ["batch", "seq"])], [_vi("y", TP.FLOAT, None)], inits=[span])
    mod = load_onnx(m)
    for seq in (3, 8):
        x = np.random.default_rng(seq).standard_normal((2, seq)).astype(np.float32)
        (got,), (ref,) = run_llvm(mod, {"x": x}), run_ort(m, {"x": x})
        np.testing.assert_allclose(got, ref, rtol=1e-6)


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_nd_of_no_updates_passes_the_data_through(run_llvm, run_ort, reduction):
    # X-MOD's dynamo export: each language's rows go through its adapter by a boolean-mask index_put; a language
    # no row has leaves a ScatterND of [0] updates at rows NonZero finds none of. TVM's kernel divided by the
    # empty extent while it was built (a crash); the result is the data unchanged
    rows = numpy_helper.from_array(np.zeros((0, 1), np.int64), "rows")
    flat = numpy_helper.from_array(np.array([-1], np.int64), "flat")
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    nodes = [helper.make_node("Equal", ["lang", "one"], ["hit"]),
             helper.make_node("NonZero", ["hit"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"], perm=[1, 0]),
             helper.make_node("GatherND", ["x", "rows"], ["picked"]),
             helper.make_node("Reshape", ["picked", "flat"], ["upd"]),
             helper.make_node("ScatterND", ["x", "idx", "upd"], ["y"],
                              **({} if reduction == "none" else {"reduction": reduction}))]
    m = _model(nodes, [_vi("x", TP.FLOAT, [2, 3]), _vi("lang", TP.INT64, [2, 3])], [_vi("y", TP.FLOAT, None)],
               inits=[rows, flat, one], opset=18)
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "lang": np.zeros((2, 3), np.int64)}
    (got,), (ref,) = run_llvm(load_onnx(m), feeds), run_ort(m, feeds)
    np.testing.assert_array_equal(got, ref)



def _two_input_model(op, dims_a, dims_c, **attrs):
    # y = op(a, c) then a dim of y read with Shape -> Gather, as a Reshape target or mask builder would
    inits = [numpy_helper.from_array(np.array(0, np.int64), "i0")]
    nodes = [helper.make_node(op, ["a", "c"], ["z"], name="combine", **attrs), helper.make_node("Shape", ["z"], ["zs"]),
             helper.make_node("Gather", ["zs", "i0"], ["d0"], axis=0),
             helper.make_node("Cast", ["d0"], ["d0f"], to=TP.FLOAT), helper.make_node("Mul", ["z", "d0f"], ["y"])]
    return _model(nodes, [_vi("a", TP.FLOAT, dims_a), _vi("c", TP.FLOAT, dims_c)], [_vi("y", TP.FLOAT, None)], inits)


def test_concat_whose_output_shape_is_unknown_is_refused_there():
    # TVM cannot show b and e equal, so the Concat's shape is unknown: before, TVM's "Check failed: ... shape_of
    # expects a tensor input" at the next Gather, or an internal error ("emit_te now only supports Tensor that has
    # ShapeExpr shape") at build time
    msg = _load_error(_two_input_model("Concat", ["b", 4], ["e", 4], axis=1),
                      ["node 'combine'", "(op Concat)", "[b, 4] and [e, 4]", "cannot be shown compatible", "--shape"])
    assert "Check failed" not in msg and "shape_of" not in msg


def test_broadcast_of_dims_not_shown_equal_is_checked_at_run_time(run_ort):
    # scores [.., past + new] plus a mask [.., total] (BLOOM's legacy KV-cache export), or a cache cropped to a
    # sliding window beside a full-length mask: TVM cannot show the dims equal and the sum's shape was unknown
    # (refused at the next Shape with TVM's "Check failed" text). The second operand is match-cast to the
    # first's dims: equal sizes run; unequal ones are one line naming the inputs (ONNX Runtime fails on them too)
    from tvm_fusion_ext.runtime import CompiledModel

    m = _two_input_model("Add", ["b", "s"], ["b", "t"])
    model = CompiledModel.from_module(load_onnx(m), fuse=False)
    rng = np.random.default_rng(0)
    for shape in ((3, 4), (1, 7)):
        feeds = {k: rng.standard_normal(shape).astype(np.float32) for k in "ac"}
        np.testing.assert_allclose(model.run(feeds)["y"], run_ort(m, feeds)[0], rtol=1e-6)
    feeds = {"a": np.ones((3, 4), np.float32), "c": np.ones((3, 5), np.float32)}
    with pytest.raises(InputError) as info:
        model.run(feeds)
    assert "\n" not in str(info.value) and "do not fit together" in str(info.value), info.value


def test_same_graph_with_one_dim_name_builds_and_matches(run_ort):
    from tvm_fusion_ext.runtime import CompiledModel

    m = _two_input_model("Add", ["b", "s"], ["b", "s"])
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal((3, 4)).astype(np.float32) for k in "ac"}
    np.testing.assert_allclose(CompiledModel.from_module(load_onnx(m), fuse=False).run(feeds)["y"],
                               run_ort(m, feeds)[0], rtol=1e-6)
    # pinning the dims (--shape) builds the Concat that is refused with them symbolic
    m = _two_input_model("Concat", ["b", 4], ["e", 4], axis=1)
    got = CompiledModel.from_module(load_onnx(m, shapes={"a": [3, 4], "c": [3, 4]}), fuse=False).run(feeds)["y"]
    np.testing.assert_allclose(got, run_ort(m, feeds)[0], rtol=1e-6)


@pytest.mark.parametrize("then", ["Div", "Sqrt"])
def test_size_cast_to_float_divides_a_tensor(run_ort, then):
    # a mean over a dynamic dim written by hand, x.sum(1) / x.shape[1] (or a scale 1/sqrt(size)), exports as
    # Shape -> Gather -> Cast(float) -> Div: TVM failed with "Check failed: ... the value in ShapeType can only have
    # dtype of int64" when the float size met a tensor
    from tvm_fusion_ext.runtime import CompiledModel

    inits = [numpy_helper.from_array(np.array(1, np.int64), "i1"), numpy_helper.from_array(np.array([1], np.int64), "ax")]
    nodes = [helper.make_node("Shape", ["x"], ["xs"]), helper.make_node("Gather", ["xs", "i1"], ["n"], axis=0),
             helper.make_node("Cast", ["n"], ["nf"], to=TP.FLOAT),
             helper.make_node("ReduceSum", ["x", "ax"], ["total"], keepdims=0)]
    if then == "Sqrt":
        nodes += [helper.make_node("Sqrt", ["nf"], ["root"]), helper.make_node("Div", ["total", "root"], ["y"])]
    else:
        nodes += [helper.make_node("Div", ["total", "nf"], ["y"])]
    m = _model(nodes, [_vi("x", TP.FLOAT, ["batch", "seq", 8])], [_vi("y", TP.FLOAT, None)], inits)
    model = CompiledModel.from_module(load_onnx(m), fuse=False)
    for shape in ((1, 3, 8), (2, 7, 8)):
        feeds = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
        np.testing.assert_allclose(model.run(feeds)["y"], run_ort(m, feeds)[0], rtol=1e-5, atol=1e-6)
