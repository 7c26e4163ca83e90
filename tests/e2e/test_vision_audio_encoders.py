"""Transformer encoders fed by something else than token ids: ViT (a Conv patch embedding of ``pixel_values``
plus a class token) and Whisper's audio encoder (two 1-D convolutions over mel features). Tiny random weights,
exported by hand (``export_hf_model`` builds text models only); the encoder layers must fuse as BERT's do and
the whole model must match torch."""

import contextlib
import io
import warnings

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


def _last_hidden_state(model, input_name: str):
    """``model`` as a module of one positional input returning ``last_hidden_state`` (what the exports trace)."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(**{input_name: x}).last_hidden_state

    return Encoder().eval()


def _vit():
    import transformers

    config = transformers.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                    image_size=32, patch_size=8, attn_implementation="sdpa")
    return transformers.ViTModel(config, add_pooling_layer=False), "pixel_values", (2, 3, 32, 32)


def _whisper():
    import transformers

    config = transformers.WhisperConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4,
                                        decoder_attention_heads=4, encoder_ffn_dim=128, num_mel_bins=16,
                                        max_source_positions=32, attn_implementation="sdpa")
    return transformers.WhisperModel(config).get_encoder(), "input_features", (1, 16, 64)


@pytest.mark.slow
@pytest.mark.parametrize("make", [_vit, _whisper], ids=["vit", "whisper-encoder"])
@pytest.mark.parametrize("exporter", ["dynamo", "legacy"])
def test_encoder_fuses_and_matches_torch(export_dir, make, exporter):
    import torch

    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.runtime import CompiledModel

    torch.manual_seed(0)
    base, name, shape = make()

    module = _last_hidden_state(base, name)
    x = torch.randn(*shape)
    path = str(export_dir / f"{make.__name__}_{exporter}.onnx")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), path, dynamo=exporter == "dynamo", opset_version=18 if exporter == "dynamo"
                          else 17, input_names=[name], output_names=["out"])
        ref = module(x).numpy()
    model = CompiledModel.from_module(load_onnx(path))
    counts = {k: model.report.fused[k] for k in ("attention", "layernorm", "qkv", "dense")}
    # ViT's patch embedding and Whisper's two convolutions become matmuls of their patches, fused as dense
    convs = {"_vit": 1, "_whisper": 2}[make.__name__]
    assert model.report.canonicalized.get("ConvAsMatmul") == convs, model.report.summary()
    assert counts == {"attention": 2, "layernorm": 5, "qkv": 2, "dense": 8 + convs}, model.report.summary()
    np.testing.assert_allclose(model.run({name: x.numpy()})["out"], ref, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["dynamo", "legacy"])
def test_swin_v2_cosine_attention_fuses_and_matches_torch(export_dir, exporter):
    """Swin-v2: cosine attention, the scores times a learned per-head logit scale (applied to q), a position bias
    from a small MLP, and in shifted layers a per-window mask added to a 5-D view of the scores (two images: the
    mask repeats per image)."""
    import torch
    import transformers

    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.runtime import CompiledModel

    torch.manual_seed(0)
    config = transformers.Swinv2Config(image_size=32, patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4],
                                       window_size=4)
    encoder = _last_hidden_state(transformers.Swinv2Model(config).eval(), "pixel_values")
    x = torch.randn(2, 3, 32, 32)
    path = str(export_dir / f"swinv2_{exporter}.onnx")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(encoder, (x,), path, dynamo=exporter == "dynamo",
                          opset_version=18 if exporter == "dynamo" else 17, input_names=["pixel_values"],
                          output_names=["out"])
        ref = encoder(x).numpy()
    if exporter == "legacy":
        # the legacy export of two images is itself unlike torch (by 1.9: a trace-time size baked in): the reference
        # is ONNX Runtime running the same file
        ort = pytest.importorskip("onnxruntime")
        ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"pixel_values": x.numpy()})[0]
    model = CompiledModel.from_module(load_onnx(path))
    assert model.report.fused["attention"] == 4, model.report.summary()
    got = model.run({"pixel_values": x.numpy()})["out"]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


@pytest.mark.slow
def test_wav2vec2_with_dynamic_batch_and_length_matches_torch(export_dir):
    """One build for every (batch, length): the grouped positional conv's reshapes hold ``len // 10`` (the feature
    encoder's strides), and a layout chain decided at sizes where that dim came out 1 was taken for a plain reshape
    (outputs off by 5). Compared with torch at two (batch, length) pairs."""
    import torch
    import transformers

    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.runtime import CompiledModel

    torch.manual_seed(0)
    config = transformers.Wav2Vec2Config(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                         intermediate_size=128, conv_dim=(32, 32), conv_stride=(5, 2),
                                         conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                         num_conv_pos_embedding_groups=4)
    encoder = _last_hidden_state(transformers.Wav2Vec2Model(config).eval(), "input_values")
    path = str(export_dir / "wav2vec2_dynamic.onnx")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(encoder, (torch.randn(2, 800),), path, dynamo=False, opset_version=17,
                          input_names=["input_values"], output_names=["out"],
                          dynamic_axes={"input_values": {0: "batch", 1: "length"}})
    compiled = CompiledModel.from_module(load_onnx(path, max_shapes={"input_values": [4, 4096]}))
    for batch, length in ((2, 800), (3, 1330)):
        x = torch.randn(batch, length)
        with torch.no_grad():
            ref = encoder(x).numpy()
        np.testing.assert_allclose(compiled.run({"input_values": x.numpy()})["out"], ref, rtol=1e-4, atol=1e-4)
