"""Opset-23 exports: torch's dynamo exporter writes ``scaled_dot_product_attention`` as ONNX's ``Attention`` op,
RMSNorm as ``RMSNormalization``, LayerNorm as ``LayerNormalization`` and, with dynamic shapes, rotary embeddings as
``RotaryEmbedding``. Those ops are the meaning itself, so they must fuse as the spelled-out forms of opset 18 do,
build, and match torch within 1e-4 with a padded mask (at two shapes for the dynamic export)."""

import numpy as np
import pytest

from tvm_fusion_ext.compile import fuse
from tvm_fusion_ext.frontend import load_onnx

pytest.importorskip("torch")
pytest.importorskip("transformers")

SEQ, BATCH = 20, 2

# (kind, fusion counts that must hold): BERT-like encoder (bidirectional, padded) and a grouped-query decoder
# (causal and padded at once, rotary). 10-20 s each on the shared 2-core box (export, fuse, one build): slow.
_LLAMA = dict(attention=2, rope=4, rmsnorm=5, gated_mlp=2, qkv=2, dense=6)
CASES = [
    pytest.param("roberta", False, dict(attention=2, layernorm=5, qkv=2, dense=8), marks=pytest.mark.slow),
    pytest.param("llama", False, _LLAMA, marks=pytest.mark.slow),
    pytest.param("llama", True, _LLAMA, marks=pytest.mark.slow),  # + RotaryEmbedding ops, symbolic lengths
]


@pytest.mark.parametrize("kind,dynamic,counts", CASES, ids=["roberta", "llama", "llama-dynamic"])
def test_opset23_export_fuses_builds_and_matches_torch(tmp_path, kind, dynamic, counts):
    import onnx
    import torch

    from tvm_fusion_ext.models import export_hf_model, hf_example_inputs, hf_input_names, hf_model
    from tvm_fusion_ext.runtime import CompiledModel

    path = export_hf_model(kind, tmp_path / f"{kind}_op23.onnx", exporter="dynamo", seq=SEQ, batch=BATCH, opset=23,
                           dynamic=dynamic, max_seq=64)
    ops = {n.op_type for n in onnx.load(path, load_external_data=False).graph.node}
    # the exporter did write the ops this test is about
    assert {"Attention", *(["RotaryEmbedding"] if dynamic else [])} <= ops, sorted(ops)
    mod = load_onnx(path)
    _, report = fuse(mod)
    assert {k: report.fused[k] for k in counts} == counts, report.summary()

    model = CompiledModel.from_module(mod)
    module, config = hf_model(kind)
    names = hf_input_names(kind)
    for batch, seq in ((BATCH, SEQ), (3, 33)) if dynamic else ((BATCH, SEQ),):
        feeds = {k: v for k, v in hf_example_inputs(config, seq=seq, batch=batch, seed=1).items() if k in names}
        got = model.run(feeds)["last_hidden_state"]
        with torch.no_grad():
            ref = module(*(torch.from_numpy(feeds[k]) for k in names)).numpy()
        valid = feeds["attention_mask"].astype(bool)
        np.testing.assert_allclose(got[valid], ref[valid], rtol=1e-4, atol=1e-4)
