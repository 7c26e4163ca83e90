"""FuseGatedMLP: SwiGLU and GeGLU (erf and tanh GELU) in exporter spellings fuse to one fused_gated_dense plus the
down projection's fused_dense, computing what numpy and the unfused graph compute, static and symbolic rows;
near misses are refused with their reason; a LLaMA-like decoder layer fuses its MLP next to its attention."""

import math

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_fusion_ext.compile import build
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.testing import assert_refused, build_module, fuse, fused_calls, numpy_activation, run_relax
from tvm_fusion_ext.transform import Canonicalize
from tvm_fusion_ext.transform.gated_mlp import GatedMLPRule

from _decoder_graphs import B as DB, D as DD, H as DH, S as DS
from _decoder_graphs import decoder_attention, numpy_decoder_attention, numpy_mlp_half

CPU = resolve_target("llvm")
RULE = GatedMLPRule()
B, S, K, N = 2, 5, 16, 24  # all different: a wrong axis is a shape error or a wrong number


def _c(v):
    return relax.const(np.asarray(v, "float32"))


def _spelt_activation(bb, g, act):
    """The activation as exporters write it (Canonicalize turns each into one op)."""
    mul, add = relax.op.multiply, relax.op.add
    if act == "silu":
        return bb.emit(mul(g, bb.emit(relax.op.sigmoid(g))))
    if act == "gelu":  # dynamo: x * (0.5 * (1 + erf(x / sqrt 2)))
        erf = bb.emit(relax.op.erf(bb.emit(relax.op.divide(g, _c(math.sqrt(2.0))))))
        return bb.emit(mul(g, bb.emit(mul(_c(0.5), bb.emit(add(erf, _c(1.0)))))))
    if act == "gelu_tanh":  # HF NewGELUActivation: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
        cube = bb.emit(mul(_c(0.044715), bb.emit(relax.op.power(g, _c(3.0)))))
        t = bb.emit(relax.op.tanh(bb.emit(mul(_c(math.sqrt(2.0 / math.pi)), bb.emit(add(g, cube))))))
        return bb.emit(mul(bb.emit(mul(g, _c(0.5))), bb.emit(add(t, _c(1.0)))))
    return bb.emit(getattr(relax.op.nn, act)(g))


def _weights(seed=0, up_n=N):
    rng = np.random.default_rng(seed)
    return {"wg": (rng.standard_normal((K, N)) / math.sqrt(K)).astype("float32"),
            "wu": (rng.standard_normal((K, up_n)) / math.sqrt(K)).astype("float32"),
            "bg": rng.standard_normal(N).astype("float32"), "bu": rng.standard_normal(up_n).astype("float32"),
            "wd": (rng.standard_normal((N, K)) / math.sqrt(N)).astype("float32")}


def gated_mlp(act="silu", gate_bias=False, up_bias=False, up_first=False, transposed=False, rows=(B, S),
              weights=None, near_miss=None):
    """``main(x [*rows, K]) -> [*rows, K]``: ``down(act(x·Wg [+bg]) ⊙ (x·Wu [+bu]))``.

    transposed: weights stored [N, K] and read through permute_dims (torch Linear). near_miss: "other_input"
    (up reads a second input), "act_on_product", "act_on_both", "param_weight" (up weight is an input)."""
    w = weights or _weights()
    x = relax.Var("x", relax.TensorType((*rows, K), "float32"))
    params = [x]
    if near_miss == "other_input":
        params.append(relax.Var("x2", relax.TensorType((*rows, K), "float32")))
    if near_miss == "param_weight":
        params.append(relax.Var("wu", relax.TensorType(w["wu"].shape, "float32")))

    def projection(bb, inp, name, bias):
        weight = params[-1] if name == "wu" and near_miss == "param_weight" else _c(w[name])
        if transposed and near_miss != "param_weight":
            weight = bb.emit(relax.op.permute_dims(_c(w[name].T.copy()), [1, 0]))
        y = bb.emit(relax.op.matmul(inp, weight))
        return bb.emit(relax.op.add(y, _c(w["b" + name[1]]))) if bias else y

    def body(bb):
        g = projection(bb, x, "wg", gate_bias)
        u = projection(bb, params[1] if near_miss == "other_input" else x, "wu", up_bias)
        if near_miss != "act_on_product":
            g = _spelt_activation(bb, g, act)
        if near_miss == "act_on_both":
            u = _spelt_activation(bb, u, act)
        y = bb.emit(relax.op.multiply(u, g) if up_first else relax.op.multiply(g, u))
        if near_miss == "act_on_product":
            y = _spelt_activation(bb, y, act)
        return relax.op.matmul(y, _c(w["wd"]))

    return build_module(params, body), w


def numpy_gated_mlp(x, w, act, gate_bias, up_bias):
    x = x.astype("float64")
    g = x @ w["wg"] + (w["bg"] if gate_bias else 0)
    u = x @ w["wu"] + (w["bu"] if up_bias else 0)
    return (numpy_activation(g, act) * u) @ w["wd"]


def _run(mod, x):
    vm = relax.VirtualMachine(build(mod, CPU), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize("act,gate_bias,up_bias,up_first,transposed", [
    ("silu", False, False, False, False),       # LLaMA / Qwen / Mistral SwiGLU
    ("silu", True, True, True, True),           # biased, torch Linear layout, up ⊙ gate
    ("gelu", True, False, False, False),        # GeGLU, erf form (ModernBERT)
    ("gelu_tanh", False, True, True, False),    # GeGLU, tanh form (Gemma)
])
def test_gated_mlp_fuses_and_matches(act, gate_bias, up_bias, up_first, transposed):
    mod, w = gated_mlp(act, gate_bias, up_bias, up_first, transposed)
    fused, report = fuse(mod)
    assert report.fused["gated_mlp"] == 1 and report.fused["dense"] == 1, report.summary()
    assert report.fused["qkv"] == 0  # the gate and up projections were not merged by the QKV rule first
    assert fused_calls(fused) == {"fused_gated_dense": 1, "fused_dense": 1}
    assert f"act={act}" in next(e.detail for e in report.applied if e.kind == "gated_mlp")
    x = np.random.default_rng(1).standard_normal((B, S, K)).astype("float32")
    ref = numpy_gated_mlp(x, w, act, gate_bias, up_bias)
    np.testing.assert_allclose(run_relax(mod, [x]), ref, rtol=1e-4, atol=1e-4)  # the unfused graph
    np.testing.assert_allclose(_run(mod, x), ref, rtol=1e-4, atol=1e-4)  # fused, templates, packed weights


def test_gated_mlp_with_symbolic_rows():
    """Dynamic batch and sequence (dynamo exports with dynamic axes): fused, built by the CPU templates, right
    at sizes that are not multiples of the register tile."""
    batch, seq = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")
    mod, w = gated_mlp("silu", gate_bias=True, rows=(batch, seq))
    _, report = fuse(mod)
    assert report.fused["gated_mlp"] == 1, report.summary()
    vm = relax.VirtualMachine(build(mod, CPU), tvm.cpu())
    rng = np.random.default_rng(3)
    for shape in ((1, 1), (2, 5), (3, 7)):
        x = rng.standard_normal((*shape, K)).astype("float32")
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(got, numpy_gated_mlp(x, w, "silu", True, False), rtol=1e-4, atol=1e-4)


def merged_gate_up(gate_half=0, bias=True, same_half=False, slices=None):
    """Phi-3's MLP: one projection to [gate | up] (2N wide), split in two along the last axis; ``slices``: by two
    strided_slices instead (a legacy export's chunk), ``((begin, end), (begin, end))`` of the first and second
    half as written (``(None)``: the true halves)."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((K, 2 * N)) / math.sqrt(K)).astype("float32")
    b = rng.standard_normal(2 * N).astype("float32")
    x = relax.Var("x", relax.TensorType((B, S, K), "float32"))

    def body(bb):
        h = bb.emit(relax.op.matmul(x, _c(w)))
        if bias:
            h = bb.emit(relax.op.add(_c(b), h))
        if slices is None:
            halves = bb.emit(relax.op.split(h, 2, axis=-1))
            parts = [bb.emit(relax.TupleGetItem(halves, i)) for i in (0, 1)]
        else:
            parts = [bb.emit(relax.op.strided_slice(h, [2], [lo], [hi])) for lo, hi in slices]
        g = parts[gate_half]
        u = parts[gate_half if same_half else 1 - gate_half]
        return relax.op.multiply(u, _spelt_activation(bb, g, "silu"))

    return build_module([x], body), w, (b if bias else np.zeros_like(b))


@pytest.mark.parametrize("gate_half,bias", [(0, True), (1, False)])
def test_merged_gate_up_projection_fuses_and_matches(gate_half, bias):
    _check_merged_fuses_and_matches(*merged_gate_up(gate_half, bias), gate_half)


def _check_merged_fuses_and_matches(mod, w, b, gate_half):
    fused, report = fuse(mod)
    assert report.fused["gated_mlp"] == 1, report.summary()
    assert fused_calls(fused) == {"fused_gated_dense": 1}
    x = np.random.default_rng(6).standard_normal((B, S, K)).astype("float32")
    h = x.astype("float64") @ w + b
    g, u = (h[..., :N], h[..., N:]) if gate_half == 0 else (h[..., N:], h[..., :N])
    np.testing.assert_allclose(_run(mod, x), numpy_activation(g, "silu") * u, rtol=1e-4, atol=1e-4)


HALVES = ((0, N), (N, 2 * N))


@pytest.mark.parametrize("slices", [HALVES, ((0, N), (-N, 2 * N + 5))], ids=["halves", "negative-and-clamped"])
@pytest.mark.parametrize("gate_half", [0, 1])
def test_merged_gate_up_sliced_in_two_fuses_and_matches(gate_half, slices):
    _check_merged_fuses_and_matches(*merged_gate_up(gate_half, slices=slices), gate_half)


@pytest.mark.parametrize("slices", [((0, N), (1, N + 1)), ((0, N - 1), (N - 1, 2 * N - 2))],
                         ids=["overlapping", "not-halves"])
def test_slices_that_are_not_the_two_halves_do_not_fuse(slices):
    mod, _, _ = merged_gate_up(slices=slices)
    fused, report = fuse(mod)
    assert report.fused["gated_mlp"] == 0, report.summary()
    assert "fused_gated_dense" not in fused_calls(fused)


def test_one_sliced_half_twice_is_refused():
    mod, _, _ = merged_gate_up(same_half=True, slices=HALVES)
    assert_refused(Canonicalize()(mod), RULE, reason="not the two halves of one split projection")


def test_one_half_of_a_split_twice_is_refused():
    mod, _, _ = merged_gate_up(same_half=True)
    assert_refused(Canonicalize()(mod), RULE, reason="not the two halves of one split projection")


@pytest.mark.parametrize("near_miss,reason", [
    ("other_input", "read different inputs"),
    ("act_on_product", "neither projection is activated"),
    ("act_on_both", "both projections are activated"),
    ("param_weight", "up weight is not a constant"),
])
def test_near_misses_are_refused(near_miss, reason):
    mod, _ = gated_mlp("silu", near_miss=near_miss)
    assert_refused(Canonicalize()(mod), RULE, reason=reason)


def test_mismatched_projection_widths_are_refused():
    """An up projection of width 1 broadcasts over the gate's columns: a valid graph, not a gated unit."""
    mod, _ = gated_mlp("silu", weights=_weights(up_n=1))
    assert_refused(Canonicalize()(mod), RULE, reason="gate weight is [16, 24] and up weight [16, 1]")


def test_llama_like_decoder_layer_fuses_attention_norm_and_gated_mlp():
    mod, weights = decoder_attention(kv_heads=2, rope="half", mlp=True)
    fused, report = fuse(mod)
    counts = report.fused
    assert counts["gated_mlp"] == 1 and counts["attention"] == 1 and counts["rmsnorm"] == 1, report.summary()
    assert fused_calls(fused)["fused_gated_dense"] == 1
    x = np.random.default_rng(4).standard_normal((DB, DS, DH * DD)).astype("float32")
    attn = numpy_decoder_attention(x, weights, kv_heads=2, rope="half")
    ref = numpy_mlp_half(x, attn, weights)
    np.testing.assert_allclose(_run(mod, x), ref, rtol=1e-4, atol=1e-4)


def _swiglu_onnx(path):
    """An ONNX SwiGLU MLP as torch's exporters write it (SiLU as Sigmoid · Mul), dynamic batch and sequence."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = _weights(seed=7)
    nodes = [helper.make_node("MatMul", ["x", "wg"], ["g"]), helper.make_node("Sigmoid", ["g"], ["sg"]),
             helper.make_node("Mul", ["g", "sg"], ["a"]), helper.make_node("MatMul", ["x", "wu"], ["u"]),
             helper.make_node("Mul", ["a", "u"], ["h"]), helper.make_node("MatMul", ["h", "wd"], ["y"])]
    graph = helper.make_graph(
        nodes, "swiglu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", K])],
        initializer=[numpy_helper.from_array(w[n], n) for n in ("wg", "wu", "wd")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return w


def test_fuse_json_counts_gated_mlps_and_the_build_matches_onnxruntime(tmp_path, capsys):
    import json

    import onnxruntime as ort

    from tvm_fusion_ext.cli import main
    from tvm_fusion_ext.runtime import CompiledModel

    path = str(tmp_path / "swiglu.onnx")
    _swiglu_onnx(path)
    assert main(["fuse", path, "--json"]) == 0
    fused = json.loads(capsys.readouterr().out)["fused"]
    assert set(fused) >= {"dense", "attention", "layernorm", "qkv", "rmsnorm", "rope", "gated_mlp"}
    assert fused["gated_mlp"] == 1 and fused["dense"] == 1 and fused["qkv"] == 0, fused
    x = np.random.default_rng(8).standard_normal((3, 7, K)).astype("float32")
    (want,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = CompiledModel.from_onnx(path).run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_phi3_mlp_export_with_merged_gate_up_fuses_and_matches_torch(tmp_path):
    """transformers' Phi3MLP (one ``gate_up_proj`` chunked in two) through the dynamo exporter."""
    import contextlib
    import io
    import warnings

    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import Phi3Config
    from transformers.models.phi3.modeling_phi3 import Phi3MLP

    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.runtime import CompiledModel

    torch.manual_seed(0)
    mlp = Phi3MLP(Phi3Config(hidden_size=32, intermediate_size=48)).eval()
    x = torch.randn(2, 5, 32)
    path = str(tmp_path / "phi3_mlp.onnx")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(mlp, (x,), path, dynamo=True, opset_version=18, input_names=["x"], output_names=["y"])
    mod = load_onnx(path)
    _, report = fuse(mod)
    assert report.fused["gated_mlp"] == 1, report.summary()
    got = CompiledModel.from_module(mod).run({"x": x.numpy()})["y"]
    with torch.no_grad():
        np.testing.assert_allclose(got, mlp(x).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_llama_export_fuses_its_gated_mlps_and_matches_torch(tmp_path):
    """A real ``transformers.LlamaConfig`` model (2 layers, GQA, random weights) through the dynamo exporter with
    batch and sequence dynamic: each layer's SwiGLU becomes one fused_gated_dense, and the compiled model
    matches torch at two shapes (~20 s: export and build)."""
    import contextlib
    import io
    import warnings

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.runtime import CompiledModel

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    llama = transformers.LlamaModel(config).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.llama = llama

        def forward(self, ids):
            return self.llama(input_ids=ids).last_hidden_state

    model = Hidden().eval()
    ids = torch.randint(0, 128, (1, 16))
    from torch.export import Dim

    dynamic = {"ids": {0: Dim("batch", min=1, max=8), 1: Dim("seq", min=1, max=64)}}
    path = str(tmp_path / "llama.onnx")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids,), path, dynamo=True, opset_version=18, input_names=["input_ids"],
                          output_names=["last_hidden_state"], dynamic_shapes=dynamic)
    mod = load_onnx(path)
    fused, report = fuse(mod)
    assert report.fused["gated_mlp"] == config.num_hidden_layers, report.summary()
    assert fused_calls(fused)["fused_gated_dense"] == config.num_hidden_layers
    compiled = CompiledModel.from_module(mod)
    for shape in ((1, 16), (2, 7)):
        ids = torch.randint(0, 128, shape)
        got = compiled.run({"input_ids": ids.numpy()})["last_hidden_state"]
        with torch.no_grad():
            ref = model(ids).numpy()
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
