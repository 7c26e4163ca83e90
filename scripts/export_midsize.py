"""Export mid-size Transformers with random weights (2 layers at their real widths) for timing against ONNX Runtime.

    python scripts/export_midsize.py OUT_DIR [--models gpt2,vit,...]
    tvm-fusion bench OUT_DIR/vit.onnx --against ort --spin --repeat 10

The tiny families of the sweeps (64 wide) check what fuses and whether it is right; these check what it costs at
the sizes users run: the kernels' tiles meet real row counts (ViT's 197 tokens), real convolutions (ViT's patch
embedding, Whisper's and wav2vec2's audio front ends, ConvNeXt's and SegFormer's depthwise filters, a
Conformer's convolution module) and real head dims. Legacy exporter (opset 17), batch 1;
LLaMA and Qwen3 with the dynamo exporter (opset 18), which exports their grouped-query attention.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import warnings


def _cases():
    import torch
    import transformers as T

    ids = lambda b, s: torch.randint(3, 1000, (b, s))  # noqa: E731
    image = lambda: {"pixel_values": torch.randn(1, 3, 224, 224)}  # noqa: E731
    return {
        "gpt2": (lambda: T.GPT2Model(T.GPT2Config(n_layer=2, n_embd=768, n_head=12, vocab_size=1000, n_positions=512)),
                 lambda: {"input_ids": ids(1, 128)}),
        "bertbase": (lambda: T.BertModel(T.BertConfig(num_hidden_layers=2), add_pooling_layer=False),
                     lambda: {"input_ids": ids(1, 128), "attention_mask": torch.ones(1, 128, dtype=torch.int64)}),
        "t5enc": (lambda: T.T5EncoderModel(T.T5Config(num_layers=2, d_model=512, d_kv=64, num_heads=8, d_ff=2048,
                                                      vocab_size=1000)), lambda: {"input_ids": ids(1, 128)}),
        "vit": (lambda: T.ViTModel(T.ViTConfig(num_hidden_layers=2), add_pooling_layer=False), image),
        "deit": (lambda: T.DeiTModel(T.DeiTConfig(num_hidden_layers=2), add_pooling_layer=False), image),
        "swin": (lambda: T.SwinModel(T.SwinConfig(depths=[2, 2, 2, 2], embed_dim=96, num_heads=[3, 6, 12, 24])),
                 image),
        "whisperenc": (lambda: T.WhisperModel(T.WhisperConfig(
            encoder_layers=2, decoder_layers=1, d_model=384, encoder_attention_heads=6, decoder_attention_heads=6,
            encoder_ffn_dim=1536, decoder_ffn_dim=1536, num_mel_bins=80, vocab_size=1000, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)).get_encoder(),
            lambda: {"input_features": torch.randn(1, 80, 3000)}),
        "wav2vec2": (lambda: T.Wav2Vec2Model(T.Wav2Vec2Config(num_hidden_layers=2)),
                     lambda: {"input_values": torch.randn(1, 16000)}),
        "conformer": (lambda: T.Wav2Vec2ConformerModel(T.Wav2Vec2ConformerConfig(
            num_hidden_layers=2, position_embeddings_type="rotary")), lambda: {"input_values": torch.randn(1, 16000)}),
        "convnext": (lambda: T.ConvNextModel(T.ConvNextConfig(depths=[1, 1, 1, 1])), image),
        "segformer": (lambda: T.SegformerModel(T.SegformerConfig()), image),
        "llama": (lambda: T.LlamaModel(T.LlamaConfig(num_hidden_layers=2, hidden_size=1024, num_attention_heads=16,
                                                     num_key_value_heads=4, intermediate_size=2816, vocab_size=1000)),
                  lambda: {"input_ids": ids(1, 256)}),
        "qwen3": (lambda: T.Qwen3Model(T.Qwen3Config(num_hidden_layers=2, hidden_size=1024, num_attention_heads=16,
                                                     num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                                                     vocab_size=1000)), lambda: {"input_ids": ids(1, 256)}),
    }


DYNAMO = ("llama", "qwen3")


def main() -> None:
    cases = _cases()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--models", default=",".join(cases))
    args = ap.parse_args()
    import torch

    os.makedirs(args.out, exist_ok=True)
    for name in args.models.split(","):
        if name not in cases:
            raise SystemExit(f"unknown model '{name}' (choose from {', '.join(cases)})")
        torch.manual_seed(0)
        make, inputs = cases[name]
        model, feeds = make().eval(), inputs()
        names = list(feeds)

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, *xs):
                out = self.m(**dict(zip(names, xs)))
                return out[0] if isinstance(out, (tuple, list)) else out.last_hidden_state

        path = os.path.join(args.out, f"{name}.onnx")
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(Wrapped().eval(), tuple(feeds.values()), path, input_names=names,
                              output_names=["out"], opset_version=18 if name in DYNAMO else 17,
                              dynamo=name in DYNAMO)
        print(path, flush=True)


if __name__ == "__main__":
    main()
