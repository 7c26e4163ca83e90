"""Models exported by torch, then rewritten by ONNX Runtime's transformer optimizer
(``onnxruntime.transformers.optimizer.optimize_model``): the optimized file must run here as ONNX Runtime runs it
(batch 2 with one row padded; a second shape for dynamic-axes files) and its contrib ops must fuse as the plain
graphs do. Tiny random-weight BERT (eager attention: the optimizer's patterns), GPT-2, ViT and LLaMA, and
all-MiniLM-L6-v2 (2 layers of its real weights). The one-node checks of every op form are in
``tests/test_ort_optimized.py``."""

from __future__ import annotations

import contextlib
import io
import warnings
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

_TINY = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128)

# name: (build, inputs, exporter, dynamic axes, optimizer (model_type, fusion options[, opt_level: 0 if not given]),
#        contrib ops the optimizer writes, fusion counts)
CASES = {
    "bert": ("bert", "text", "legacy", True, ("bert", {}),
             {"EmbedLayerNormalization": 1, "Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2},
             {"attention": 2, "dense": 8, "layernorm": 5}),
    "bert-mha": ("bert", "text", "legacy", False, ("bert", {"use_multi_head_attention": True}),
                 {"MultiHeadAttention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2},
                 {"attention": 2, "dense": 8, "layernorm": 5, "qkv": 2}),
    "minilm": ("minilm", "text", "legacy", True, ("bert", {}),
               {"EmbedLayerNormalization": 1, "Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2},
               {"attention": 2, "dense": 8, "layernorm": 5}),
    # pre-norm: the residual is SkipLayerNormalization's input_skip_bias_sum output
    "gpt2": ("gpt2", "text", "legacy", True, ("gpt2", {}), {"SkipLayerNormalization": 4, "FastGelu": 2},
             {"attention": 2, "dense": 8, "layernorm": 5}),
    "vit": ("vit", "pixels", "dynamo", False, ("vit", {}), {"SkipLayerNormalization": 4, "BiasGelu": 2},
            {"attention": 2, "dense": 9, "layernorm": 5}),
    # RMSNorm as SimplifiedLayerNormalization (ONNX domain) and SkipSimplifiedLayerNormalization; SiLU as QuickGelu,
    # which ONNX Runtime's own graph optimizer writes (opt_level 2) before the Python fusions run
    "llama": ("llama", "text", "dynamo", False, ("gpt2", {}, 2),
              {"SkipSimplifiedLayerNormalization": 4, "QuickGelu": 2},
              {"attention": 2, "rope": 4, "rmsnorm": 5, "gated_mlp": 2}),
}
BATCH, SEQ = 2, 20


def _module(kind):
    import torch
    import transformers

    torch.manual_seed(0)
    if kind == "minilm":
        from tvm_fusion_ext.models.hf import minilm_weights_dir

        model = transformers.AutoModel.from_pretrained(minilm_weights_dir(), attn_implementation="eager")
        model.encoder.layer = model.encoder.layer[:2]
        return model, ["input_ids", "attention_mask", "token_type_ids"]
    if kind == "bert":
        config = transformers.BertConfig(**_TINY, vocab_size=1000, max_position_embeddings=128)
        config._attn_implementation = "eager"  # the pattern the optimizer's Attention fusion reads
        return transformers.BertModel(config, add_pooling_layer=False), ["input_ids", "attention_mask",
                                                                          "token_type_ids"]
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_inner=160, vocab_size=1000, n_positions=128)
        return transformers.GPT2Model(config), ["input_ids", "attention_mask"]
    if kind == "vit":
        config = transformers.ViTConfig(**_TINY, image_size=32, patch_size=8)
        return transformers.ViTModel(config, add_pooling_layer=False), ["pixel_values"]
    config = transformers.LlamaConfig(**_TINY, num_key_value_heads=2, vocab_size=1000, max_position_embeddings=128)
    return transformers.LlamaModel(config), ["input_ids", "attention_mask"]


def _feeds(names, batch, seq, seed=0):
    """Token ids with one padded row (the last 3 positions of row 0), or pixels."""
    rng = np.random.default_rng(seed)
    if names == ["pixel_values"]:
        return {"pixel_values": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)}
    mask = np.ones((batch, seq), np.int64)
    mask[0, seq - 3:] = 0
    feeds = {"input_ids": rng.integers(3, 1000, (batch, seq)), "attention_mask": mask,
             "token_type_ids": np.zeros((batch, seq), np.int64)}
    return {n: feeds[n] for n in names}


def _export_and_optimize(case, out_dir):
    import torch
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    kind, _, exporter, dynamic, (model_type, options, *level), _, _ = CASES[case]
    model, names = _module(kind)

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *xs):
            return self.model(**dict(zip(names, xs))).last_hidden_state

    args = tuple(torch.from_numpy(v) for v in _feeds(names, BATCH, SEQ).values())
    path, optimized = str(out_dir / f"{case}.onnx"), str(out_dir / f"{case}.opt.onnx")
    kw = dict(input_names=names, output_names=["out"])
    if dynamic:
        kw["dynamic_axes"] = {**{n: {0: "batch", 1: "seq"} for n in names}, "out": {0: "batch", 1: "seq"}}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Wrapped().eval(), args, path, dynamo=exporter == "dynamo",
                          opset_version=17 if exporter == "legacy" else 18, **kw)
        fusion = FusionOptions(model_type)
        for key, value in options.items():
            setattr(fusion, key, value)
        heads, hidden = (12, 384) if kind == "minilm" else (4, 64)
        optimize_model(path, model_type=model_type, num_heads=heads, hidden_size=hidden,
                       opt_level=level[0] if level else 0,
                       optimization_options=fusion).save_model_to_file(optimized)
    return optimized, names


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_optimized_model_matches_onnx_runtime_and_fuses(case, tmp_path):
    import onnx
    import onnxruntime as ort

    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.runtime import CompiledModel

    path, names = _export_and_optimize(case, tmp_path)
    contrib = Counter(n.op_type for n in onnx.load(path).graph.node if n.domain == "com.microsoft"
                      or n.op_type == "SimplifiedLayerNormalization")
    for op, count in CASES[case][5].items():  # the optimizer wrote what this case is about
        assert contrib[op] == count, contrib
    compiled = CompiledModel.from_module(load_onnx(path))
    fused = compiled.report.fused
    assert {k: fused[k] for k in CASES[case][6]} == CASES[case][6], compiled.report.summary()
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    shapes = [(BATCH, SEQ), (3, 13)] if CASES[case][3] else [(BATCH, SEQ)]
    taken = {i.name: i.type.tensor_type.elem_type for i in onnx.load(path).graph.input}
    for batch, seq in shapes:
        feeds = {k: v.astype(np.int32 if taken[k] == onnx.TensorProto.INT32 else v.dtype)
                 for k, v in _feeds(names, batch, seq, seed=batch).items() if k in taken}
        want = session.run(None, feeds)[0]
        got = compiled.run(feeds)["out"]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * max(1.0, float(np.abs(want).max())),
                                   err_msg=f"{case} at batch {batch}, seq {seq}")
