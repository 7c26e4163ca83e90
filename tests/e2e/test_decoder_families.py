"""Current model families a user brings: tiny random-weight LLaMA (grouped-query and not), Qwen2
(biased Q/K/V projections) and ModernBERT (LayerNorm without bias, GeGLU, rotary embeddings, alternating
global/local attention), exported with torch's dynamo exporter as their users do. Every attention must fuse
with its rotary embeddings, the RMSNorms must fuse, and the build must match torch within 1e-4 with a padded
attention mask (the decoders' masks are causal and padded at once)."""

import numpy as np
import pytest

from tvm_fusion_ext.compile import fuse
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.testing import tensor_shapes

pytest.importorskip("torch")
pytest.importorskip("transformers")

SEQ = 24  # not the head dim (16): rotary tables are [1, S, D]
LAYERS = 2

# (kind, RMSNorms: two per layer and the final one; none in ModernBERT). Exports take 5-25 s each: slow.
FAMILIES = [pytest.param("llama", 2 * LAYERS + 1, marks=pytest.mark.slow),
            pytest.param("llama-mha", 2 * LAYERS + 1, marks=pytest.mark.slow),
            pytest.param("qwen2", 2 * LAYERS + 1, marks=pytest.mark.slow),
            pytest.param("modernbert", 0, marks=pytest.mark.slow)]


@pytest.mark.parametrize("kind,rmsnorms", FAMILIES)
def test_family_fuses_builds_and_matches_torch(export_dir, kind, rmsnorms):
    import torch

    from tvm_fusion_ext.models import export_hf_model, hf_example_inputs, hf_input_names, hf_model
    from tvm_fusion_ext.runtime import CompiledModel

    path = export_hf_model(kind, export_dir / f"{kind}_dynamo.onnx", exporter="dynamo", seq=SEQ)
    mod = load_onnx(path)
    fused, report = fuse(mod)
    assert report.fused["attention"] == LAYERS, report.fused
    assert report.fused["rope"] == 2 * LAYERS, report.fused  # Q and K of every layer, rotated inside the kernel
    assert report.fused["rmsnorm"] == rmsnorms, report.fused
    assert report.fused["gated_mlp"] == LAYERS, report.fused  # SwiGLU (two projections), GeGLU (one, chunked)
    assert report.fused["dense"] >= 3 * LAYERS, report.fused
    assert not [s for s in tensor_shapes(fused) if len(s) >= 2 and s[-2:] == [SEQ, SEQ]], \
        "an S x S tensor is left in the fused graph"
    # a causal model with padding is not packed (padding removal leaves decoders padded): refused, with its reason
    _, packed = fuse(mod, remove_padding=True)
    assert packed.padding_removed == 0 and [e for e in packed.refused if e.rule == "RemovePadding"], \
        packed.summary()

    module, config = hf_model(kind)
    feeds = {k: v for k, v in hf_example_inputs(config, seq=SEQ, seed=1).items() if k in hf_input_names(kind)}
    assert (feeds["attention_mask"] == 0).any(), "the comparison must cover padded positions"
    got = CompiledModel.from_module(mod).run(feeds)["last_hidden_state"]
    with torch.no_grad():
        ref = module(*(torch.from_numpy(feeds[k]) for k in hf_input_names(kind))).numpy()
    valid = feeds["attention_mask"].astype(bool)
    np.testing.assert_allclose(got[valid], ref[valid], rtol=1e-4, atol=1e-4)
