"""Real exports: all-MiniLM-L6-v2 (legacy and dynamo exporters x sdpa and eager attention) and a random
BERT-base-sized config. Every layer's attention, GELU dense and both residual LayerNorms must fuse, QKV once
per layer, no S x S tensor may remain, and the built model must match torch."""

import numpy as np
import pytest

from tvm_fusion_ext.compile import fuse
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.testing import tensor_shapes

pytestmark = pytest.mark.slow

EXPORTS = [("legacy", "sdpa"), ("legacy", "eager"), ("dynamo", "sdpa"), ("dynamo", "eager")]


def _gelu_dense(report):
    return sum(1 for e in report.applied if e.rule == "FuseMatmulBiasActivation" and "act=gelu" in e.detail
               and "gelu_tanh" not in e.detail)


def _assert_fully_fused(fused, report, layers, seq):
    assert report.fused["attention"] == layers
    assert _gelu_dense(report) == layers
    # two residual LayerNorms per layer, plus the embeddings' (word + position + type) LayerNorm
    assert report.fused["layernorm"] == 2 * layers + 1
    assert report.fused["qkv"] == layers
    # per layer: the QKV projection, attention output, FFN up (GELU) and FFN down are dense layers
    assert report.fused["dense"] == 4 * layers
    assert not [s for s in tensor_shapes(fused) if len(s) >= 2 and s[-1] == seq and s[-2] == seq], \
        "an S x S tensor is left in the fused graph"
    script = fused["main"].script()
    for op in ("R.nn.softmax", "R.nn.layer_norm", "R.erf", "R.nn.gelu("):
        assert op not in script, f"{op} left after fusion"


def _torch_reference(kind, attn, seq, num_layers, feeds):
    import torch

    from tvm_fusion_ext.models import hf_model

    module, _ = hf_model(kind, attn=attn, num_layers=num_layers)
    with torch.no_grad():
        return module(*(torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask",
                                                              "token_type_ids"))).numpy()


@pytest.mark.parametrize("exporter,attn", EXPORTS)
def test_minilm_fully_fused_and_matches_torch(minilm_export, exporter, attn):
    from tvm_fusion_ext.models import hf_example_inputs, hf_model
    from tvm_fusion_ext.runtime import CompiledModel

    seq = 128
    path = minilm_export(exporter, attn, seq=seq)
    mod = load_onnx(path)
    fused, report = fuse(mod)
    _assert_fully_fused(fused, report, layers=6, seq=seq)

    _, config = hf_model("minilm", attn=attn)
    feeds = hf_example_inputs(config, seq=seq, seed=1)
    got = CompiledModel.from_module(mod).run(feeds)["last_hidden_state"]
    ref = _torch_reference("minilm", attn, seq, None, feeds)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def bert_base_export(export_dir):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tvm_fusion_ext.models import export_hf_model

    paths = {}

    def make(exporter, attn, seq):
        key = (exporter, attn, seq)
        if key not in paths:
            paths[key] = export_hf_model("bert-base", export_dir / f"bert_base_{exporter}_{attn}_{seq}.onnx",
                                         exporter=exporter, attn=attn, seq=seq)
        return paths[key]

    return make


@pytest.mark.parametrize("exporter,attn", [("legacy", "sdpa"), ("dynamo", "eager")])
def test_bert_base_fully_fused_and_matches_torch(bert_base_export, exporter, attn):
    from transformers import BertConfig

    from tvm_fusion_ext.models import hf_example_inputs
    from tvm_fusion_ext.runtime import CompiledModel

    seq = 32  # the graph is BERT-base sized (12 layers, 768 wide); a short sequence keeps the run cheap
    path = bert_base_export(exporter, attn, seq)
    mod = load_onnx(path)
    fused, report = fuse(mod)
    _assert_fully_fused(fused, report, layers=12, seq=seq)

    feeds = hf_example_inputs(BertConfig(), seq=seq, seed=2)
    got = CompiledModel.from_module(mod).run(feeds)["last_hidden_state"]
    ref = _torch_reference("bert-base", attn, seq, None, feeds)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_shipped_tuning_records_cover_every_minilm_kernel(minilm_export):
    """`tuning_logs/` names its kernels by structure: an operator change that alters a tuned PrimFunc silently
    drops its record (the build then uses template defaults). Every fused kernel must still find one."""
    import os

    import tvm

    from tvm_fusion_ext.compile import lower
    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.transform.pipeline import SemanticFusion
    from tvm_fusion_ext.records import open_database, select

    import json

    mod = load_onnx(minilm_export("legacy", "sdpa", seq=128))
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tuning_logs")
    # the CPU the records were tuned on, whatever this host is: kernels are laid out for their target (an AVX-512
    # host packs wider weight panels), and records of another CPU never apply to a build for this one
    with open(os.path.join(root, "minilm-llvm-znver3", "manifest.json")) as f:
        target = resolve_target(json.loads(json.loads(f.read())["target_spec"]))
    path, message = select(root, mod, target)
    assert path is not None, message  # the pinned torch exports the model the records were tuned for
    db = open_database(path)
    lowered = lower(SemanticFusion()(mod), target)
    kernels = {gv.name_hint: f for gv, f in lowered.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and "tfx.op" in f.attrs}
    missing = [name for name, f in kernels.items()
               if not db.has_workload(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}))]
    assert len(kernels) >= 6 and not missing, missing
