"""``precision="int8"`` and ``"bf16"`` on CUDA, compiled with nvcc (no GPU needed): the int8 dense runs on tensor
cores (mma.sync m16n8k32 with u8 activations and s8 weights, int32 accumulation) on sm_80 and sm_90 without
spills, other shapes take the SIMT dense, and a whole encoder builds (the row quantisation's stock kernels bound to
threads); bf16 takes the bf16 tensor-core dense. The gated MLP's pair is one such dense over its gate's and up
projection's columns side by side, then the gate product, an elementwise kernel dlight binds. Numerics need a GPU:
``tests/gpu/test_cuda_precision_numerics.py`` and the GPU campaign's int8 and gated cases (the SIMT paths run on
PoCL: ``tests/opencl/test_simt_int8.py``)."""

import json
import shutil

import pytest
import tvm
from tvm import relax, s_tir

from tvm_fusion_ext.ops.registry import make_prim_func
from tvm_fusion_ext.schedules.registry import get_template
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.tools.inspect_cuda import cuda_sources, kernel_report

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

MMA_U8_S8 = "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32"
MMA_BF16 = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
MMA = {"int8": MMA_U8_S8, "bf16": MMA_BF16}


@pytest.fixture(autouse=True)
def _nvcc_mode(monkeypatch):
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")


def _int8_dense(M, K, N, act, arch, transpose_b=True):
    ty = lambda s, dt: relax.TensorType(list(s), dt)  # noqa: E731
    types = {"x": ty((1, M, K), "uint8"), "x_scale": ty((1, M, 1), "float32"), "x_zero": ty((1, M, 1), "int32"),
             "w": ty((N, K) if transpose_b else (K, N), "int8"), "w_scale": ty((N,), "float32"),
             "w_sum": ty((N,), "int32"), "bias": ty((N,), "float32")}
    func = make_prim_func("fused_dense_int8", types, {"act": act, "transpose_b": transpose_b})
    sch = s_tir.Schedule(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), seed=1)
    target = resolve_target(f"cuda:{arch}")
    block = next(b for b in sch.get_child_blocks(sch.get_sblock("root"))
                 if str(sch.get(b).annotations.get("schedule_rule", "")) == "tfx.dense")
    get_template("tfx.dense", target)(sch, block, target)
    (src,) = cuda_sources(tvm.compile(sch.mod, target))
    (row,) = kernel_report(src, arch)
    return row, src


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("M,K,N,act", [
    (128, 384, 1152, "none"),  # all-MiniLM-L6-v2's QKV projection at seq 128
    (128, 384, 1536, "gelu"),  # its FFN up
    (128, 1536, 384, "none"),  # its FFN down
    (16, 4096, 4096, "none"),  # a LLaMA-7B projection at a decode-sized batch
])
def test_int8_dense_on_tensor_cores_without_spills(M, K, N, act, arch):
    row, src = _int8_dense(M, K, N, act, arch)
    assert row["tensor_core"], row
    assert MMA_U8_S8 in src  # u8 activations × s8 weights, int32 accumulators
    assert src.count("ldmatrix.sync.aligned.m8n8.x4.shared.b16") >= 2
    assert row["spill_bytes"] == 0 and row["stack_bytes"] == 0, row
    assert row["registers"] <= 64, row  # 16 int32 accumulators and two fragments a thread


@pytest.mark.parametrize("M,K,N,transpose_b", [
    (128, 48, 64, True),   # K not a multiple of 32
    (20, 64, 64, True),    # rows not a multiple of 16
    (128, 64, 64, False),  # a (K, N) weight: ldmatrix cannot transpose bytes
])
def test_int8_dense_off_the_tensor_core_shapes_takes_simt(M, K, N, transpose_b):
    row, src = _int8_dense(M, K, N, "none", "sm_80", transpose_b)
    assert not row["tensor_core"] and "mma.sync" not in src, row
    assert row["spill_bytes"] == 0, row


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_inspect_cuda_int8_tiny_encoder(arch):
    from tvm_fusion_ext.models import default_model_path
    from tvm_fusion_ext.tools.inspect_cuda import inspect_cuda

    rows = inspect_cuda(default_model_path(), arch=arch, precision="int8")
    assert all(r["spill_bytes"] == 0 for r in rows), [r for r in rows if r["spill_bytes"]]
    dense = [r for r in rows if r["name"].startswith("fused_dense")]
    assert dense and all(r["name"].startswith("fused_dense_int8") and r["tensor_core"] for r in dense), dense
    assert all(r["threads_per_block"] > 0 for r in rows)  # the quantisation kernels too: dlight bound them


@pytest.mark.slow  # another encoder build (~10 s of nvcc)
def test_inspect_cuda_cli_int8_json(capsys):
    from tvm_fusion_ext.cli import main
    from tvm_fusion_ext.models import default_model_path

    assert main(["inspect-cuda", default_model_path(), "--arch", "sm_80", "--precision", "int8", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r for r in rows if r["name"].startswith("fused_dense_int8") and r["tensor_core"]]


def test_inspect_cuda_int8_takes_float32(capsys):
    from tvm_fusion_ext.cli import main
    from tvm_fusion_ext.models import default_model_path

    assert main(["inspect-cuda", default_model_path(), "--precision", "int8", "--dtype", "float16"]) != 0
    err = capsys.readouterr().err.strip()
    assert err == "error: precision int8 quantises a float32 model's weights: use it with dtype float32, not float16"


def test_compile_model_int8_for_cuda_reports_its_kernels():
    from tvm_fusion_ext.compile import compile_model
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.models import default_model_path

    compiled = compile_model(load_onnx(default_model_path()), "cuda:sm_80", precision="int8")
    assert compiled.precision.converted == {"fused_dense": 8}  # 2 layers: QKV, output, FFN up and down
    assert compiled.precision.features == []  # LLVM features: a CPU notion


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_bf16_precision_on_cuda_takes_the_bf16_tensor_core_dense(arch):
    from tvm_fusion_ext.models import default_model_path
    from tvm_fusion_ext.tools.inspect_cuda import inspect_cuda

    rows = inspect_cuda(default_model_path(), arch=arch, precision="bf16")
    assert all(r["spill_bytes"] == 0 for r in rows), [r for r in rows if r["spill_bytes"]]
    dense = [r for r in rows if r["name"].startswith("fused_dense")]
    assert dense and all(r["tensor_core"] for r in dense), dense


def test_int8_cuda_artifact_says_its_accuracy_was_not_measured(tmp_path):
    # the accuracy contract runs both builds in this process: a CUDA artifact records that it did not
    from tvm_fusion_ext.compile.artifact import compile_artifact
    from tvm_fusion_ext.models import default_model_path

    manifest = compile_artifact(default_model_path(), str(tmp_path / "art"), target="cuda:sm_80", precision="int8")
    precision = manifest["precision"]
    assert precision["precision"] == "int8" and precision["converted"] == {"fused_dense": 8}
    assert "accuracy" not in precision
    assert "accuracy against fp32 not measured: a cuda build runs on its device, not here" in precision["notes"]


def test_int8_dense_with_symbolic_rows_builds_on_the_fallback():
    # the template declines rows known only at run time (its padded-row path is fp16/fp32 only); dlight binds it
    import numpy as np

    from tvm_fusion_ext.compile import compile_model
    from tvm_fusion_ext.ops.registry import call_op

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, tvm.tirx.Var("seq", "int64"), 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(np.random.default_rng(0).standard_normal((64, 48)).astype("float32"))
            out = bb.emit_output(bb.emit(call_op(bb, "fused_dense", {"x": x, "w": w}, {"act": "gelu"})))
        bb.emit_func_output(out)
    compiled = compile_model(bb.get(), "cuda:sm_80", fuse_graph=False, precision="int8")
    rows = [r for src in cuda_sources(compiled.executable) for r in kernel_report(src, "sm_80")]
    dense = [r for r in rows if r["name"].startswith("fused_dense_int8")]
    assert dense and not dense[0]["tensor_core"] and all(r["spill_bytes"] == 0 for r in rows), rows


def _gated_pair(rows, K, N, act="silu"):
    """A SwiGLU/GeGLU pair (``fused_gated_dense``) with constant weights and biases, alone in a module."""
    import numpy as np

    from tvm_fusion_ext.ops.gated_dense import interleave_weights
    from tvm_fusion_ext.ops.registry import call_op

    rng = np.random.default_rng(0)
    wg, wu = (rng.standard_normal((2, K, N)) / np.sqrt(K)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, rows, K), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            given = {"x": x, "w": relax.const(interleave_weights(wg, wu)),
                     "bias": relax.const(rng.standard_normal((N, 2)).astype("float32"))}
            out = bb.emit_output(bb.emit(call_op(bb, "fused_gated_dense", given, {"act": act})))
        bb.emit_func_output(out)
    return bb.get()


def _kernels(compiled, arch):
    sources = cuda_sources(compiled.executable)
    return [r for src in sources for r in kernel_report(src, arch)], "\n".join(sources)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("precision", ["int8", "bf16"])
@pytest.mark.parametrize("rows,K,N,act", [
    (16, 1024, 2816, "silu"),  # the LLaMA-1024 MLP at a decode-sized batch
    (128, 64, 160, "gelu"),    # the tiny LLaMA's at a prefill of 128 tokens
])
def test_gated_pair_is_one_tensor_core_dense_and_a_gate_product(precision, arch, rows, K, N, act):
    from tvm_fusion_ext.compile import compile_model

    compiled = compile_model(_gated_pair(rows, K, N, act), f"cuda:{arch}", fuse_graph=False, precision=precision)
    assert compiled.precision.converted == {"fused_gated_dense": 1} and not compiled.precision.kept
    rows_, src = _kernels(compiled, arch)
    assert all(r["spill_bytes"] == 0 and r["stack_bytes"] == 0 for r in rows_), rows_
    assert not [r for r in rows_ if "gated_dense" in r["name"]], rows_  # no fp32 gated kernel left
    (dense,) = [r for r in rows_ if r["name"].startswith("fused_dense")]
    assert dense["tensor_core"] and MMA[precision] in src, dense
    assert dense["registers"] <= 64, dense  # as the plain dense: 16 accumulators and two fragments a thread
    assert dense["name"].startswith("fused_dense_int8") == (precision == "int8")
    (gate,) = [r for r in rows_ if "gate_product" in r["name"]]
    assert gate["threads_per_block"] > 0 and not gate["tensor_core"], gate  # bound to threads (dlight)


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_gated_pair_off_the_tensor_core_shapes_takes_simt(precision):
    # rows, K and 2N not multiples of the tiles: the SIMT dense (its numerics on PoCL: tests/opencl)
    from tvm_fusion_ext.compile import compile_model

    compiled = compile_model(_gated_pair(13, 37, 40), "cuda:sm_80", fuse_graph=False, precision=precision)
    assert compiled.precision.converted == {"fused_gated_dense": 1}
    rows, src = _kernels(compiled, "sm_80")
    (dense,) = [r for r in rows if r["name"].startswith("fused_dense")]
    assert not dense["tensor_core"] and "mma.sync" not in src
    assert all(r["spill_bytes"] == 0 for r in rows) and [r for r in rows if "gate_product" in r["name"]], rows


#: the tiny LLaMA (tests/conftest.py) at one request of 16 new tokens after 16 cached ones: static rows, so its
#: projections can take tensor cores
TINY_LM_SHAPES = "input_ids:1x16,attention_mask:1x32,position_ids:1x16,past_key_values.*:1x2x16x16"


@pytest.mark.parametrize("precision,arch", [
    ("int8", "sm_80"), ("bf16", "sm_90"),
    pytest.param("int8", "sm_90", marks=pytest.mark.slow), pytest.param("bf16", "sm_80", marks=pytest.mark.slow),
])
def test_tiny_llama_on_cuda_converts_its_gated_mlps(tiny_causal_lm, precision, arch):
    """Every projection in ``precision``, the gated MLP's pair included (one dense of width 2N, then the gate
    product); the four per layer (QKV, output, the gated pair, down) on tensor cores; the LM head (1000 columns,
    not a multiple of 16) on the SIMT dense; nothing spills."""
    from tvm_fusion_ext.compile import compile_model
    from tvm_fusion_ext.frontend import load_onnx, parse_shape_arg

    mod = load_onnx(tiny_causal_lm, shapes=parse_shape_arg(TINY_LM_SHAPES))
    compiled = compile_model(mod, f"cuda:{arch}", precision=precision)
    assert compiled.precision.converted == {"fused_dense": 7, "fused_gated_dense": 2}  # 2 layers; the LM head
    assert compiled.precision.kept == []
    rows, src = _kernels(compiled, arch)
    assert all(r["spill_bytes"] == 0 for r in rows), [r for r in rows if r["spill_bytes"]]
    assert all(r["threads_per_block"] > 0 for r in rows)
    assert not [r for r in rows if "gated_dense" in r["name"]]
    dense = {r["name"]: r["tensor_core"] for r in rows if r["name"].startswith("fused_dense")}
    # the layers share their kernels: QKV, output, the gated pair, down, and the LM head
    assert sorted(dense.values()) == [False, True, True, True, True], dense
    assert MMA[precision] in src and [r for r in rows if "gate_product" in r["name"]]


@pytest.mark.slow  # another tiny LLaMA build (~15 s of nvcc)
def test_inspect_cuda_cli_pins_shapes_for_the_tensor_cores(tiny_causal_lm, capsys):
    from tvm_fusion_ext.cli import main

    args = ["inspect-cuda", tiny_causal_lm, "--arch", "sm_80", "--precision", "bf16", "--json"]
    assert main(args + ["--shape", TINY_LM_SHAPES]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len([r for r in rows if r["name"].startswith("fused_dense") and r["tensor_core"]]) == 4
    assert main(args) == 0  # dynamic rows: the SIMT dense
    rows = json.loads(capsys.readouterr().out)
    assert not [r for r in rows if r["tensor_core"]] and all(r["spill_bytes"] == 0 for r in rows)
