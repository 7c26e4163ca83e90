"""Export Hugging Face families that no test covers (tiny random weights), build each with the package, and
compare with torch at the valid positions: the sweep behind docs/exporter-notes.md, "More families" and "Opset-23 exports".
Prints one line per case: ``ok`` with the largest difference and the fusion counts, ``refused`` with our one-line
error, ``export-failed`` when torch cannot export it, ``export-differs`` when the exported file itself is unlike
torch at a shape (ONNX Runtime running it disagrees with torch there and agrees with us; ``max |diff|`` then covers
the other shapes), ``degenerate`` when torch's own output is below 1e-3 everywhere (random weights whose signal
vanished: agreement proves nothing; raise the family's ``initializer_range``), or ``FAIL`` for anything else (a
crash, a wrong answer).

    python scripts/sweep_unnamed_families.py [--families swin,granite] [--exporters legacy,dynamo,opset23,dynamic,...]
        [--artifact]

Exporters: ``legacy`` (opset 17), ``dynamo`` (opset 18), ``opset23`` (dynamo: ONNX's Attention / RMSNormalization
ops), ``dynamic`` (legacy with dynamic batch and sequence: also compared at batch 3, seq 13 for text, batch 1 for
images, batch 1 of 640 samples for audio), ``dynamo-dynamic`` (the same with dynamo and ``torch.export.Dim``s).
``--artifact`` compiles each export to an artifact directory and runs it as deployed (``deploy.load``).
Text inputs are batch 2, seq 20 with rows of 18 and 14 valid tokens. Each case runs in its own process (a crash is
charged to its case); 5-60 s each on the 2-core box.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import warnings

import numpy as np

BATCH, SEQ = 2, 20
_TEXT = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=1000,
             max_position_embeddings=128)
_DECODER = dict(_TEXT, num_key_value_heads=2)
_SEQ2SEQ = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=1000)
_VISION = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
               patch_size=8)
_AUDIO = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, conv_dim=(32, 32),
              conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)

# name: (config class, model class, config arguments, model keyword arguments, inputs: "text" | "text+decoder" |
#        a pixel/audio shape | (input name, *shape) for other float inputs (filterbank features, time series; only
#        their batch is dynamic), and how the model is reached: None or a method giving the encoder)
FAMILIES = {
    "bart-encoder": ("BartConfig", "BartModel", dict(_SEQ2SEQ, max_position_embeddings=128), {}, "text", "get_encoder"),
    "marian-encoder": ("MarianConfig", "MarianMTModel", dict(_SEQ2SEQ, max_position_embeddings=128, pad_token_id=0,
                                                              decoder_start_token_id=0), {}, "text", "get_encoder"),
    "clip-text": ("CLIPTextConfig", "CLIPTextModel", dict(_TEXT, max_position_embeddings=64), {}, "text", None),
    "clip-vision": ("CLIPVisionConfig", "CLIPVisionModel", _VISION, {}, (2, 3, 32, 32), None),
    "siglip-vision": ("SiglipVisionConfig", "SiglipVisionModel", _VISION, {}, (2, 3, 32, 32), None),
    "swin": ("SwinConfig", "SwinModel", dict(image_size=32, patch_size=2, embed_dim=16, depths=[2, 2],
                                            num_heads=[2, 4], window_size=4), {}, (1, 3, 32, 32), None),
    "convnext": ("ConvNextConfig", "ConvNextModel", dict(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2,
                                                         image_size=32), {}, (1, 3, 32, 32), None),
    "dinov2": ("Dinov2Config", "Dinov2Model", dict(_VISION, mlp_ratio=2), {}, (2, 3, 32, 32), None),
    "beit": ("BeitConfig", "BeitModel", dict(_VISION, use_relative_position_bias=True),
             {"add_pooling_layer": False}, (2, 3, 32, 32), None),
    "vit": ("ViTConfig", "ViTModel", _VISION, {"add_pooling_layer": False}, (2, 3, 32, 32), None),
    "wav2vec2": ("Wav2Vec2Config", "Wav2Vec2Model", _AUDIO, {}, (2, 800), None),
    "mobilebert": ("MobileBertConfig", "MobileBertModel", dict(
        _TEXT, intermediate_size=64, intra_bottleneck_size=32, embedding_size=32, true_hidden_size=32),
        {"add_pooling_layer": False}, "text", None),
    "squeezebert": ("SqueezeBertConfig", "SqueezeBertModel", dict(_TEXT, embedding_size=64), {}, "text", None),
    "roformer": ("RoFormerConfig", "RoFormerModel", dict(_TEXT, embedding_size=64), {}, "text", None),
    "esm": ("EsmConfig", "EsmModel", dict(_TEXT, vocab_size=33, pad_token_id=1, position_embedding_type="rotary"),
            {"add_pooling_layer": False}, "text", None),
    "bert": ("BertConfig", "BertModel", _TEXT, {"add_pooling_layer": False}, "text", None),
    "bert-relative-key": ("BertConfig", "BertModel", dict(_TEXT, position_embedding_type="relative_key"),
                          {"add_pooling_layer": False}, "text", None),
    "bert-decoder": ("BertConfig", "BertModel", dict(_TEXT, is_decoder=True), {"add_pooling_layer": False}, "text",
                     None),
    "megatron-bert": ("MegatronBertConfig", "MegatronBertModel", _TEXT, {"add_pooling_layer": False}, "text", None),
    "funnel": ("FunnelConfig", "FunnelBaseModel", dict(block_sizes=[1, 1], num_decoder_layers=1, d_model=64, n_head=4,
                                                       d_head=16, d_inner=128, vocab_size=1000), {}, "text", None),
    "gpt2": ("GPT2Config", "GPT2Model", dict(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128), {},
             "text", None),
    "gpt-bigcode": ("GPTBigCodeConfig", "GPTBigCodeModel", dict(n_layer=2, n_embd=64, n_head=4, n_inner=128,
                                                                vocab_size=1000, n_positions=128, multi_query=True),
                    {}, "text", None),
    "codegen": ("CodeGenConfig", "CodeGenModel", dict(n_layer=2, n_embd=64, n_head=4, n_inner=128, vocab_size=1000,
                                                      n_positions=128, n_ctx=128, rotary_dim=8), {}, "text", None),
    "llama": ("LlamaConfig", "LlamaModel", _DECODER, {}, "text", None),
    "qwen3": ("Qwen3Config", "Qwen3Model", dict(_DECODER, head_dim=16), {}, "text", None),
    "mistral": ("MistralConfig", "MistralModel", dict(_DECODER, sliding_window=8), {}, "text", None),
    "phi3": ("Phi3Config", "Phi3Model", dict(_DECODER, pad_token_id=0), {}, "text", None),
    "stablelm": ("StableLmConfig", "StableLmModel", dict(_DECODER, partial_rotary_factor=0.25), {}, "text", None),
    "starcoder2": ("Starcoder2Config", "Starcoder2Model", dict(_DECODER, sliding_window=8), {}, "text", None),
    "granite": ("GraniteConfig", "GraniteModel", dict(_DECODER, attention_multiplier=0.3, embedding_multiplier=2.0,
                                                      residual_multiplier=0.5), {}, "text", None),
    "nemotron": ("NemotronConfig", "NemotronModel", dict(_DECODER, head_dim=16), {}, "text", None),
    "persimmon": ("PersimmonConfig", "PersimmonModel", dict(_TEXT, qk_layernorm=True), {}, "text", None),
    "modernbert": ("ModernBertConfig", "ModernBertModel", dict(_TEXT, pad_token_id=0, global_attn_every_n_layers=2,
                                                               local_attention=8), {}, "text", None),
    "mpt": ("MptConfig", "MptModel", dict(d_model=64, n_heads=4, n_layers=2, expansion_ratio=2, vocab_size=1000,
                                          max_seq_len=128), {}, "text", None),
    "mamba": ("MambaConfig", "MambaModel", dict(hidden_size=64, num_hidden_layers=2, vocab_size=1000, state_size=8),
              {}, "text-only-ids", None),
    "t5": ("T5Config", "T5Model", dict(num_layers=2, d_model=64, d_kv=16, num_heads=4, d_ff=128, vocab_size=1000,
                                       decoder_start_token_id=0), {}, "text+decoder", None),
    "whisper": ("WhisperConfig", "WhisperModel", dict(_SEQ2SEQ, num_mel_bins=16, max_source_positions=32,
                                                      max_target_positions=32, pad_token_id=0, bos_token_id=1,
                                                      eos_token_id=2, decoder_start_token_id=1),
                {}, "audio+decoder", None),
    "mixtral": ("MixtralConfig", "MixtralModel", dict(_DECODER, num_local_experts=4, num_experts_per_tok=2), {},
                "text", None),
    # added 2026-11-24: GPT-Neo's alternating global/local (windowed, unscaled) attention, ConvBERT's span-based
    # dynamic convolution beside its heads, XLM's sinusoidal positions and language embeddings, XLNet's two-stream
    # relative attention, FNet's Fourier mixing (no attention), HuBERT and WavLM (gated relative position bias),
    # DeiT's distillation token, Nyströmformer's landmark attention, BigBird and Longformer (full attention below
    # their block/window), Gemma 3's text model (sliding and global layers, q/k norms)
    "gpt-neo": ("GPTNeoConfig", "GPTNeoModel", dict(num_layers=2, attention_types=[[["global", "local"], 1]],
                                                    hidden_size=64, num_heads=4, intermediate_size=128,
                                                    vocab_size=1000, max_position_embeddings=128, window_size=8),
                {}, "text", None),
    "convbert": ("ConvBertConfig", "ConvBertModel", dict(_TEXT, embedding_size=64, head_ratio=2, conv_kernel_size=3),
                 {}, "text", None),
    "xlm": ("XLMConfig", "XLMModel", dict(vocab_size=1000, emb_dim=64, n_layers=2, n_heads=4, max_position_embeddings=128,
                                         sinusoidal_embeddings=True), {}, "text", None),
    "xlnet": ("XLNetConfig", "XLNetModel", dict(vocab_size=1000, d_model=64, n_layer=2, n_head=4, d_inner=128), {},
              "text", None),
    "fnet": ("FNetConfig", "FNetModel", dict(_TEXT, use_tpu_fourier_optimizations=False), {"add_pooling_layer": False},
             "text-only-ids", None),
    "hubert": ("HubertConfig", "HubertModel", _AUDIO, {}, (2, 800), None),
    "wavlm": ("WavLMConfig", "WavLMModel", dict(_AUDIO, num_buckets=32, max_bucket_distance=64), {}, (2, 800), None),
    "deit": ("DeiTConfig", "DeiTModel", _VISION, {"add_pooling_layer": False}, (2, 3, 32, 32), None),
    "nystromformer": ("NystromformerConfig", "NystromformerModel", dict(_TEXT, num_landmarks=4,
                                                                        segment_means_seq_len=20), {}, "text", None),
    "bigbird": ("BigBirdConfig", "BigBirdModel", dict(_TEXT, attention_type="original_full"),
                {"add_pooling_layer": False}, "text", None),
    "longformer": ("LongformerConfig", "LongformerModel", dict(_TEXT, attention_window=8), {"add_pooling_layer": False},
                   "text", None),
    "gemma3-text": ("Gemma3TextConfig", "Gemma3TextModel", dict(_DECODER, head_dim=16, sliding_window=8,
                                                                  query_pre_attn_scalar=16), {}, "text", None),
    # added 2026-11-25: families of 2025-26 and older ones no sweep had reached
    "gpt-neox": ("GPTNeoXConfig", "GPTNeoXModel", dict(_TEXT, rotary_pct=0.25), {}, "text", None),
    "olmo": ("OlmoConfig", "OlmoModel", _DECODER, {}, "text", None),
    "olmo3": ("Olmo3Config", "Olmo3Model", dict(_DECODER, sliding_window=8), {}, "text", None),
    "biogpt": ("BioGptConfig", "BioGptModel", _TEXT, {}, "text", None),
    "glm4": ("Glm4Config", "Glm4Model", dict(_DECODER, head_dim=16, partial_rotary_factor=0.5, pad_token_id=0), {},
             "text", None),
    "deepseek-v3": ("DeepseekV3Config", "DeepseekV3Model", dict(
        _TEXT, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
        v_head_dim=16,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=2, n_group=1,
        topk_group=1), {}, "text", None),
    "gpt-oss": ("GptOssConfig", "GptOssModel", dict(_DECODER, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                                      sliding_window=8), {}, "text", None),
    "lfm2": ("Lfm2Config", "Lfm2Model", dict(_DECODER, layer_types=["conv", "full_attention"]), {}, "text", None),
    "smollm3": ("SmolLM3Config", "SmolLM3Model", dict(_DECODER, no_rope_layer_interval=2, pad_token_id=0), {},
                "text", None),
    "arcee": ("ArceeConfig", "ArceeModel", _DECODER, {}, "text", None),
    "apertus": ("ApertusConfig", "ApertusModel", _DECODER, {}, "text", None),
    "exaone4": ("Exaone4Config", "Exaone4Model", dict(_DECODER, sliding_window=8), {}, "text", None),
    "ernie4.5": ("Ernie4_5Config", "Ernie4_5Model", dict(_DECODER, head_dim=16), {}, "text", None),
    "seed-oss": ("SeedOssConfig", "SeedOssModel", dict(_DECODER, head_dim=16), {}, "text", None),
    "bitnet": ("BitNetConfig", "BitNetModel", _DECODER, {}, "text", None),
    "cohere2": ("Cohere2Config", "Cohere2Model", dict(_DECODER, sliding_window=8), {}, "text", None),
    "modernbert-decoder": ("ModernBertDecoderConfig", "ModernBertDecoderModel", dict(
        _TEXT, pad_token_id=0, global_attn_every_n_layers=2, local_attention=8), {}, "text", None),
    "qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeModel", dict(_DECODER, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                                          moe_intermediate_size=32), {}, "text", None),
    "granite-moe": ("GraniteMoeConfig", "GraniteMoeModel", dict(_DECODER, num_local_experts=4, num_experts_per_tok=2),
                    {}, "text", None),
    "hunyuan": ("HunYuanDenseV1Config", "HunYuanDenseV1Model", dict(_DECODER, head_dim=16), {}, "text", None),
    "eurobert": ("EuroBertConfig", "EuroBertModel", dict(_DECODER, pad_token_id=0), {}, "text", None),
    "rembert": ("RemBertConfig", "RemBertModel", dict(_TEXT, input_embedding_size=32, output_embedding_size=32),
                {"add_pooling_layer": False}, "text", None),
    "ernie": ("ErnieConfig", "ErnieModel", _TEXT, {"add_pooling_layer": False}, "text", None),
    "data2vec-text": ("Data2VecTextConfig", "Data2VecTextModel", dict(_TEXT, pad_token_id=1),
                      {"add_pooling_layer": False}, "text", None),
    "roberta-prelayernorm": ("RobertaPreLayerNormConfig", "RobertaPreLayerNormModel", dict(_TEXT, pad_token_id=1),
                             {"add_pooling_layer": False}, "text", None),
    "xlm-roberta-xl": ("XLMRobertaXLConfig", "XLMRobertaXLModel", dict(_TEXT, pad_token_id=1),
                       {"add_pooling_layer": False}, "text", None),
    "splinter": ("SplinterConfig", "SplinterModel", _TEXT, {}, "text", None),
    "canine": ("CanineConfig", "CanineModel", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                    intermediate_size=128, downsampling_rate=4, num_hash_buckets=64,
                                                    num_hash_functions=4, local_transformer_stride=8,
                                                    max_position_embeddings=128), {}, "text", None),
    "pegasus-encoder": ("PegasusConfig", "PegasusModel", dict(_SEQ2SEQ, max_position_embeddings=128, pad_token_id=0,
                                                               decoder_start_token_id=0), {}, "text", "get_encoder"),
    "mbart-encoder": ("MBartConfig", "MBartModel", dict(_SEQ2SEQ, max_position_embeddings=128), {}, "text",
                      "get_encoder"),
    "m2m100-encoder": ("M2M100Config", "M2M100Model", dict(_SEQ2SEQ, max_position_embeddings=128, pad_token_id=1), {},
                       "text", "get_encoder"),
    "umt5-encoder": ("UMT5Config", "UMT5EncoderModel", dict(num_layers=2, d_model=64, d_kv=16, num_heads=4, d_ff=128,
                                                             vocab_size=1000), {}, "text", None),
    "longt5-encoder": ("LongT5Config", "LongT5EncoderModel", dict(num_layers=2, d_model=64, d_kv=16, num_heads=4,
                                                                   d_ff=128, vocab_size=1000, local_radius=4,
                                                                   encoder_attention_type="local"), {}, "text", None),
    "mobilevit": ("MobileViTConfig", "MobileViTModel", dict(image_size=32, hidden_sizes=[32, 48, 64],
                                                             neck_hidden_sizes=[8, 8, 16, 16, 32, 32, 64],
                                                             num_attention_heads=2, initializer_range=0.4),
                  {}, (1, 3, 32, 32), None),
    "segformer": ("SegformerConfig", "SegformerModel", dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                                                             hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                                                             patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2]),
                  {}, (1, 3, 32, 32), None),
    "levit": ("LevitConfig", "LevitModel", dict(image_size=32, hidden_sizes=[32, 48, 64], num_attention_heads=[1, 2, 2],
                                                 depths=[1, 1, 1], key_dim=[8, 8, 8], initializer_range=0.15),
              {}, (1, 3, 32, 32), None),
    "yolos": ("YolosConfig", "YolosModel", dict(_VISION, num_detection_tokens=4, image_size=[32, 32]),
              {"add_pooling_layer": False}, (2, 3, 32, 32), None),
    "swinv2": ("Swinv2Config", "Swinv2Model", dict(image_size=32, patch_size=2, embed_dim=16, depths=[2, 2],
                                                    num_heads=[2, 4], window_size=4), {}, (1, 3, 32, 32), None),
    "convnextv2": ("ConvNextV2Config", "ConvNextV2Model", dict(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2,
                                                                image_size=32), {}, (1, 3, 32, 32), None),
    "focalnet": ("FocalNetConfig", "FocalNetModel", dict(image_size=32, embed_dim=16, depths=[1, 1],
                                                          focal_levels=[2, 2], focal_windows=[3, 3]), {},
                 (1, 3, 32, 32), None),
    "data2vec-audio": ("Data2VecAudioConfig", "Data2VecAudioModel", _AUDIO, {}, (2, 800), None),
    "sew": ("SEWConfig", "SEWModel", dict(_AUDIO, squeeze_factor=2), {}, (2, 800), None),
    "unispeech": ("UniSpeechConfig", "UniSpeechModel", _AUDIO, {}, (2, 800), None),
    # added 2026-11-26: mixtures of experts, hybrids with recurrent or state-space layers, chunked and linear
    # attention, 2-D rotary vision encoders, pyramid and additive-attention vision models, conformer audio
    "deberta": ("DebertaConfig", "DebertaModel", dict(_TEXT, relative_attention=True, pos_att_type=["c2p", "p2c"],
                                                      max_relative_positions=32), {}, "text", None),
    "ibert": ("IBertConfig", "IBertModel", dict(_TEXT, pad_token_id=1), {"add_pooling_layer": False}, "text", None),
    "yoso": ("YosoConfig", "YosoModel", dict(_TEXT, use_expectation=True, pad_token_id=1), {}, "text", None),
    "roc-bert": ("RoCBertConfig", "RoCBertModel", dict(_TEXT, pronunciation_vocab_size=32, shape_vocab_size=32,
                                                       pronunciation_embed_dim=16, shape_embed_dim=16),
                 {"add_pooling_layer": False}, "text", None),
    "flaubert": ("FlaubertConfig", "FlaubertModel", dict(vocab_size=1000, emb_dim=64, n_layers=2, n_heads=4,
                                                         max_position_embeddings=128, pre_norm=True), {}, "text",
                 None),
    "luke": ("LukeConfig", "LukeModel", dict(_TEXT, entity_vocab_size=10, entity_emb_size=32),
             {"add_pooling_layer": False}, "text", None),
    "ctrl": ("CTRLConfig", "CTRLModel", dict(n_layer=2, n_embd=64, n_head=4, dff=128, vocab_size=1000,
                                             n_positions=128), {}, "text", None),
    "qwen2-moe": ("Qwen2MoeConfig", "Qwen2MoeModel", dict(_DECODER, num_experts=4, num_experts_per_tok=2,
                                                          moe_intermediate_size=32,
                                                          shared_expert_intermediate_size=64), {}, "text", None),
    "olmoe": ("OlmoeConfig", "OlmoeModel", dict(_DECODER, num_experts=4, num_experts_per_tok=2), {}, "text", None),
    "jetmoe": ("JetMoeConfig", "JetMoeModel", dict(hidden_size=64, num_hidden_layers=2, num_key_value_heads=2,
                                                   kv_channels=16, intermediate_size=128, num_local_experts=4,
                                                   num_experts_per_tok=2, vocab_size=1000,
                                                   max_position_embeddings=128), {}, "text", None),
    "phimoe": ("PhimoeConfig", "PhimoeModel", dict(_DECODER, num_local_experts=4, num_experts_per_tok=2), {}, "text",
               None),
    "dbrx": ("DbrxConfig", "DbrxModel", dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=128, vocab_size=1000,
                                             attn_config={"kv_n_heads": 2, "rope_theta": 10000.0},
                                             ffn_config={"ffn_hidden_size": 128, "moe_num_experts": 4,
                                                         "moe_top_k": 2}), {}, "text", None),
    "glm": ("GlmConfig", "GlmModel", dict(_DECODER, head_dim=16, partial_rotary_factor=0.5, pad_token_id=0), {},
            "text", None),
    "recurrent-gemma": ("RecurrentGemmaConfig", "RecurrentGemmaModel", dict(
        num_hidden_layers=2, vocab_size=1000, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=1, lru_width=64, attention_window_size=8, block_types=["recurrent", "attention"],
        head_dim=16), {}, "text", None),
    "jamba": ("JambaConfig", "JambaModel", dict(_DECODER, num_experts=2, num_experts_per_tok=1, attn_layer_period=2,
                                                attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
                                                mamba_d_state=8, mamba_expand=2, use_mamba_kernels=False), {}, "text",
              None),
    "falcon-h1": ("FalconH1Config", "FalconH1Model", dict(_DECODER, head_dim=16, mamba_d_ssm=64, mamba_n_heads=4,
                                                          mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8,
                                                          mamba_chunk_size=8), {}, "text", None),
    "minimax": ("MiniMaxConfig", "MiniMaxModel", dict(_DECODER, head_dim=16, num_local_experts=4,
                                                      num_experts_per_tok=2, block_size=8,
                                                      layer_types=["linear_attention", "full_attention"]), {}, "text",
                None),
    "doge": ("DogeConfig", "DogeModel", dict(_DECODER, keep_window_size=8), {}, "text", None),
    "llama4-text": ("Llama4TextConfig", "Llama4TextModel", dict(_DECODER, head_dim=16, num_local_experts=2,
                                                                num_experts_per_tok=1, interleave_moe_layer_step=2,
                                                                intermediate_size_mlp=128, attention_chunk_size=8),
                    {}, "text", None),
    "ministral": ("MinistralConfig", "MinistralModel", dict(_DECODER, sliding_window=8, head_dim=16), {},
                  "text", None),
    "vaultgemma": ("VaultGemmaConfig", "VaultGemmaModel", dict(_DECODER, head_dim=16, sliding_window=8), {}, "text",
                   None),
    "flex-olmo": ("FlexOlmoConfig", "FlexOlmoModel", dict(_DECODER, num_experts=2, num_experts_per_tok=1, pad_token_id=0,
                                                          eos_token_id=2), {}, "text", None),
    "glm4-moe": ("Glm4MoeConfig", "Glm4MoeModel", dict(_DECODER, head_dim=16, n_routed_experts=4,
                                                       num_experts_per_tok=2, moe_intermediate_size=32,
                                                       first_k_dense_replace=1, n_group=1, topk_group=1,
                                                       partial_rotary_factor=0.5), {}, "text", None),
    "qwen3-next": ("Qwen3NextConfig", "Qwen3NextModel", dict(_DECODER, head_dim=16, num_experts=4,
                                                             num_experts_per_tok=2, moe_intermediate_size=32,
                                                             shared_expert_intermediate_size=32,
                                                             linear_num_value_heads=4, linear_num_key_heads=2,
                                                             linear_key_head_dim=16, linear_value_head_dim=16,
                                                             layer_types=["linear_attention", "full_attention"]),
                   {}, "text", None),
    "rwkv": ("RwkvConfig", "RwkvModel", dict(hidden_size=64, num_hidden_layers=2, vocab_size=1000, context_length=128,
                                             attention_hidden_size=64, intermediate_size=128), {}, "text-only-ids",
             None),
    "blenderbot-encoder": ("BlenderbotConfig", "BlenderbotModel", dict(_SEQ2SEQ, max_position_embeddings=128), {},
                           "text", "get_encoder"),
    "led-encoder": ("LEDConfig", "LEDModel", dict(_SEQ2SEQ, max_encoder_position_embeddings=128,
                                                  max_decoder_position_embeddings=128, attention_window=8), {},
                    "text", "get_encoder"),
    "prophetnet-encoder": ("ProphetNetConfig", "ProphetNetModel", dict(
        hidden_size=64, encoder_ffn_dim=128, decoder_ffn_dim=128, num_encoder_layers=2, num_decoder_layers=2,
        num_encoder_attention_heads=4, num_decoder_attention_heads=4, vocab_size=1000, max_position_embeddings=128),
        {}, "text", "get_encoder"),
    "switch-encoder": ("SwitchTransformersConfig", "SwitchTransformersEncoderModel", dict(
        num_layers=2, d_model=64, d_kv=16, num_heads=4, d_ff=128, vocab_size=1000, num_experts=4,
        encoder_sparse_step=2), {}, "text", None),
    "mt5-encoder": ("MT5Config", "MT5EncoderModel", dict(num_layers=2, d_model=64, d_kv=16, num_heads=4, d_ff=128,
                                                         vocab_size=1000), {}, "text", None),
    "vit-msn": ("ViTMSNConfig", "ViTMSNModel", _VISION, {}, (2, 3, 32, 32), None),
    "data2vec-vision": ("Data2VecVisionConfig", "Data2VecVisionModel", dict(_VISION, use_relative_position_bias=True),
                        {"add_pooling_layer": False}, (2, 3, 32, 32), None),
    "dpt": ("DPTConfig", "DPTModel", _VISION, {"add_pooling_layer": False}, (2, 3, 32, 32), None),
    "ijepa": ("IJepaConfig", "IJepaModel", _VISION, {"add_pooling_layer": False}, (2, 3, 32, 32), None),
    "pvt": ("PvtConfig", "PvtModel", dict(num_encoder_blocks=2, depths=[1, 1], sequence_reduction_ratios=[2, 1],
                                          hidden_sizes=[16, 32], patch_sizes=[4, 2], strides=[4, 2],
                                          num_attention_heads=[1, 2], mlp_ratios=[2, 2], image_size=32), {},
            (1, 3, 32, 32), None),
    "pvt-v2": ("PvtV2Config", "PvtV2Model", dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                                                 hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                                                 num_attention_heads=[1, 2], mlp_ratios=[2, 2]), {}, (1, 3, 32, 32),
               None),
    "dinov2-registers": ("Dinov2WithRegistersConfig", "Dinov2WithRegistersModel",
                         dict(_VISION, mlp_ratio=2, num_register_tokens=2), {}, (2, 3, 32, 32), None),
    "dinov3": ("DINOv3ViTConfig", "DINOv3ViTModel", dict(_VISION, num_register_tokens=2), {}, (2, 3, 32, 32), None),
    "aimv2-vision": ("Aimv2VisionConfig", "Aimv2VisionModel", _VISION, {}, (2, 3, 32, 32), None),
    "vitdet": ("VitDetConfig", "VitDetModel", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                   image_size=32, patch_size=8, pretrain_image_size=32,
                                                   window_size=2, window_block_indices=[0],
                                                   use_relative_position_embeddings=True), {}, (1, 3, 32, 32), None),
    "mobilevitv2": ("MobileViTV2Config", "MobileViTV2Model", dict(image_size=32, width_multiplier=0.5), {},
                    (1, 3, 32, 32), None),
    "cvt": ("CvtConfig", "CvtModel", dict(embed_dim=[16, 32, 64], num_heads=[1, 2, 4], depth=[1, 2, 3],
                                          cls_token=[False, False, True], drop_path_rate=[0.0, 0.0, 0.0]),
            {"add_pooling_layer": False}, (1, 3, 32, 32), None),
    "swiftformer": ("SwiftFormerConfig", "SwiftFormerModel", dict(depths=[1, 1, 1, 1], embed_dims=[16, 16, 32, 32]),
                    {}, (1, 3, 32, 32), None),
    "wav2vec2-conformer": ("Wav2Vec2ConformerConfig", "Wav2Vec2ConformerModel",
                           dict(_AUDIO, position_embeddings_type="rotary", conv_depthwise_kernel_size=7), {},
                           (2, 800), None),
    "wav2vec2-conformer-rel": ("Wav2Vec2ConformerConfig", "Wav2Vec2ConformerModel",
                               dict(_AUDIO, position_embeddings_type="relative", conv_depthwise_kernel_size=7), {},
                               (2, 800), None),
    "sew-d": ("SEWDConfig", "SEWDModel", dict(_AUDIO, squeeze_factor=2, max_position_embeddings=64,
                                              position_buckets=32), {}, (2, 800), None),
    "unispeech-sat": ("UniSpeechSatConfig", "UniSpeechSatModel", _AUDIO, {}, (2, 800), None),
    # added 2026-11-26: BERT variants with layout/markup/rotary embeddings, MLA and differential attention, MoE with shared
    # experts, state-space hybrids, CNN and hierarchical vision models, audio encoders fed filterbank features,
    # seq2seq encoders with block-local attention, patched time series
    "camembert": ("CamembertConfig", "CamembertModel", dict(_TEXT, pad_token_id=1), {"add_pooling_layer": False},
                  "text", None),
    "layoutlm": ("LayoutLMConfig", "LayoutLMModel", _TEXT, {}, "text", None),
    "markuplm": ("MarkupLMConfig", "MarkupLMModel", dict(_TEXT, pad_token_id=1), {"add_pooling_layer": False},
                 "text", None),
    "lilt": ("LiltConfig", "LiltModel", dict(_TEXT, hidden_size=48, pad_token_id=1, channel_shrink_ratio=4),
             {"add_pooling_layer": False}, "text", None),
    "nomic-bert": ("NomicBertConfig", "NomicBertModel", _TEXT, {}, "text", None),
    "gte": ("GteConfig", "GteModel", _TEXT, {}, "text", None),
    "mra": ("MraConfig", "MraModel", dict(_TEXT, pad_token_id=1, max_position_embeddings=130, block_per_row=2), {},
            "text", None),
    "xmod": ("XmodConfig", "XmodModel", dict(_TEXT, pad_token_id=1, languages=["en_XX", "de_DE"],
                                             default_language="en_XX"), {"add_pooling_layer": False}, "text", None),
    "tapas": ("TapasConfig", "TapasModel", _TEXT, {"add_pooling_layer": False}, "text", None),
    "bert-generation": ("BertGenerationConfig", "BertGenerationEncoder", _TEXT, {}, "text", None),
    "jina-v3": ("JinaEmbeddingsV3Config", "JinaEmbeddingsV3Model", dict(_TEXT, pad_token_id=1),
                {"add_pooling_layer": False}, "text", None),
    "openai-gpt": ("OpenAIGPTConfig", "OpenAIGPTModel", dict(n_layer=2, n_embd=64, n_head=4, vocab_size=1000,
                                                             n_positions=128), {}, "text", None),
    "gpt-neox-japanese": ("GPTNeoXJapaneseConfig", "GPTNeoXJapaneseModel", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_multiple_size=2, vocab_size=1000,
        max_position_embeddings=128), {}, "text", None),
    "diffllama": ("DiffLlamaConfig", "DiffLlamaModel", _DECODER, {}, "text", None),
    "minicpm3": ("MiniCPM3Config", "MiniCPM3Model", dict(_DECODER, num_key_value_heads=4, kv_lora_rank=16,
                                                        q_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                                        v_head_dim=16, head_dim=24), {}, "text", None),
    "deepseek-v2": ("DeepseekV2Config", "DeepseekV2Model", dict(
        _DECODER, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1,
        n_group=1, topk_group=1, n_shared_experts=1), {}, "text", None),
    "dots1": ("Dots1Config", "Dots1Model", dict(_DECODER, moe_intermediate_size=32, n_routed_experts=4,
                                                num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                                                n_group=1, topk_group=1), {}, "text", None),
    "granitemoe-shared": ("GraniteMoeSharedConfig", "GraniteMoeSharedModel", dict(
        _DECODER, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=64), {}, "text", None),
    "hunyuan-moe": ("HunYuanMoEV1Config", "HunYuanMoEV1Model", dict(_DECODER, head_dim=16, num_experts=4, moe_topk=2),
                    {}, "text", None),
    "ernie4.5-moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeModel", dict(_DECODER, moe_intermediate_size=32,
                                                                    moe_num_experts=4, moe_k=2,
                                                                    moe_num_shared_experts=1), {}, "text", None),
    "zamba2": ("Zamba2Config", "Zamba2Model", dict(_DECODER, num_hidden_layers=2, layers_block_type=["mamba", "hybrid"],
                                                   mamba_d_state=8, n_mamba_heads=4, mamba_ngroups=1, chunk_size=8,
                                                   num_mem_blocks=1, adapter_rank=8, use_mem_rope=True,
                                                   use_mamba_kernels=False), {}, "text", None),
    "bamba": ("BambaConfig", "BambaModel", dict(_DECODER, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=32,
                                                mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=8), {}, "text",
              None),
    "mamba2": ("Mamba2Config", "Mamba2Model", dict(hidden_size=64, num_hidden_layers=2, vocab_size=1000, num_heads=8,
                                                   head_dim=16, state_size=8, n_groups=1, chunk_size=8), {},
               "text-only-ids", None),
    "falcon-mamba": ("FalconMambaConfig", "FalconMambaModel", dict(hidden_size=64, num_hidden_layers=2,
                                                                   vocab_size=1000, state_size=8,
                                                                   use_mambapy=False), {}, "text-only-ids", None),
    "nemotron-h": ("NemotronHConfig", "NemotronHModel", dict(
        hidden_size=64, vocab_size=1000, layers_block_type=["mamba", "attention", "mlp"], num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=128, ssm_state_size=8, mamba_num_heads=4,
        mamba_head_dim=32, n_groups=1, chunk_size=8, max_position_embeddings=128, use_mamba_kernels=False), {},
        "text", None),
    "cwm": ("CwmConfig", "CwmModel", dict(_DECODER, head_dim=16, sliding_window=8,
                                          layer_types=["sliding_attention", "full_attention"]), {}, "text", None),
    "jais2": ("Jais2Config", "Jais2Model", dict(_DECODER, head_dim=16), {}, "text", None),
    "solar-open": ("SolarOpenConfig", "SolarOpenModel", dict(_DECODER, head_dim=16, moe_intermediate_size=32,
                                                             n_routed_experts=4, num_experts_per_tok=2,
                                                             n_shared_experts=1, n_group=1, topk_group=1), {},
                   "text", None),
    "nanochat": ("NanoChatConfig", "NanoChatModel", _DECODER, {}, "text", None),
    "youtu": ("YoutuConfig", "YoutuModel", dict(_DECODER, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32,
                                                qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16), {}, "text",
              None),
    "hiera": ("HieraConfig", "HieraModel", dict(embed_dim=16, image_size=[32, 32], patch_size=[3, 3],
                                                patch_stride=[2, 2], patch_padding=[1, 1], depths=[1, 1],
                                                num_heads=[1, 2], query_stride=[2, 2], masked_unit_size=[4, 4],
                                                masked_unit_attention=[True, False], num_query_pool=1),
              {"add_pooling_layer": False},
              (2, 3, 32, 32), None),
    "poolformer": ("PoolFormerConfig", "PoolFormerModel", dict(depths=[1, 1, 1, 1], hidden_sizes=[16, 16, 32, 32]),
                   {}, (1, 3, 32, 32), None),
    "resnet": ("ResNetConfig", "ResNetModel", dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1]), {},
               (1, 3, 32, 32), None),
    "regnet": ("RegNetConfig", "RegNetModel", dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                                   groups_width=8), {}, (1, 3, 32, 32), None),
    "glpn": ("GLPNConfig", "GLPNModel", dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                                             hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                                             num_attention_heads=[1, 2], mlp_ratios=[2, 2]), {}, (1, 3, 32, 32),
             None),
    "mlcd-vision": ("MLCDVisionConfig", "MLCDVisionModel", _VISION, {}, (2, 3, 32, 32), None),
    "ast": ("ASTConfig", "ASTModel", dict(_VISION, patch_size=8, frequency_stride=8, time_stride=8, max_length=32,
                                          num_mel_bins=16), {}, ("input_values", 2, 32, 16), None),
    "speech-to-text-encoder": ("Speech2TextConfig", "Speech2TextModel", dict(
        _SEQ2SEQ, input_feat_per_channel=16, conv_channels=32, max_source_positions=64, max_target_positions=64),
        {}, ("input_features", 2, 40, 16), "get_encoder"),
    "moonshine-encoder": ("MoonshineConfig", "MoonshineModel", dict(
        hidden_size=64, intermediate_size=128, encoder_num_hidden_layers=2, decoder_num_hidden_layers=2,
        encoder_num_attention_heads=4, decoder_num_attention_heads=4, vocab_size=1000), {}, (2, 1600),
        "get_encoder"),
    "wav2vec2-bert": ("Wav2Vec2BertConfig", "Wav2Vec2BertModel", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        feature_projection_input_dim=32, conv_depthwise_kernel_size=7, left_max_position_embeddings=16,
        right_max_position_embeddings=4), {}, ("input_features", 2, 30, 32), None),
    "parakeet-encoder": ("ParakeetEncoderConfig", "ParakeetEncoder", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, num_mel_bins=16,
        subsampling_conv_channels=16, conv_kernel_size=9, max_position_embeddings=256), {},
        ("input_features", 2, 64, 16), None),
    "plbart-encoder": ("PLBartConfig", "PLBartModel", dict(_SEQ2SEQ, max_position_embeddings=128, pad_token_id=1), {},
                       "text", "get_encoder"),
    "mvp-encoder": ("MvpConfig", "MvpModel", dict(_SEQ2SEQ, max_position_embeddings=128), {}, "text", "get_encoder"),
    "fsmt-encoder": ("FSMTConfig", "FSMTModel", dict(
        d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128, src_vocab_size=1000, tgt_vocab_size=1000, langs=["en", "de"],
        max_position_embeddings=128, pad_token_id=1), {}, "text", "get_encoder"),
    "pegasus-x-encoder": ("PegasusXConfig", "PegasusXModel", dict(
        _SEQ2SEQ, max_position_embeddings=128, pad_token_id=0, decoder_start_token_id=0, block_size=4,
        num_global_tokens=4), {}, "text", "get_encoder"),
    "blenderbot-small-encoder": ("BlenderbotSmallConfig", "BlenderbotSmallModel", dict(
        _SEQ2SEQ, max_position_embeddings=128), {}, "text", "get_encoder"),
    "bigbird-pegasus-encoder": ("BigBirdPegasusConfig", "BigBirdPegasusModel", dict(
        _SEQ2SEQ, max_position_embeddings=128, attention_type="original_full"), {}, "text", "get_encoder"),
    "patchtst": ("PatchTSTConfig", "PatchTSTModel", dict(num_input_channels=3, context_length=32, patch_length=8,
                                                         patch_stride=8, num_hidden_layers=2, d_model=64,
                                                         num_attention_heads=4, ffn_dim=128),
                 {}, ("past_values", 2, 32, 3), None),
    # added 2026-11-27: the decoder families users deploy most that no sweep had reached (Qwen2, Gemma 1/2 with capped
    # scores, Phi's partial rotary with a parallel block, OPT, BLOOM's ALiBi, GPT-J, Falcon's multi-query parallel
    # block, XGLM, Cohere, Helium, OLMo 2), DeBERTa-v2's disentangled attention, the encoders tests/e2e runs only
    # static (ALBERT, DistilBERT, ELECTRA), CNNs with depthwise convolutions, and a video transformer (5-D input)
    "qwen2": ("Qwen2Config", "Qwen2Model", _DECODER, {}, "text", None),
    "gemma": ("GemmaConfig", "GemmaModel", dict(_DECODER, head_dim=16), {}, "text", None),
    "gemma2": ("Gemma2Config", "Gemma2Model", dict(_DECODER, head_dim=16, sliding_window=8,
                                                   attn_logit_softcapping=50.0, query_pre_attn_scalar=16), {},
               "text", None),
    "phi": ("PhiConfig", "PhiModel", dict(_TEXT, partial_rotary_factor=0.5), {}, "text", None),
    "opt": ("OPTConfig", "OPTModel", dict(hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
                                          vocab_size=1000, max_position_embeddings=128, word_embed_proj_dim=64),
            {}, "text", None),
    "bloom": ("BloomConfig", "BloomModel", dict(hidden_size=64, n_layer=2, n_head=4, vocab_size=1000), {}, "text",
              None),
    "gptj": ("GPTJConfig", "GPTJModel", dict(n_embd=64, n_layer=2, n_head=4, rotary_dim=8, vocab_size=1000,
                                             n_positions=128, n_inner=128), {}, "text", None),
    "falcon": ("FalconConfig", "FalconModel", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                   vocab_size=1000, multi_query=True, parallel_attn=True,
                                                   new_decoder_architecture=False, alibi=False), {}, "text", None),
    "xglm": ("XGLMConfig", "XGLMModel", dict(d_model=64, num_layers=2, attention_heads=4, ffn_dim=128, vocab_size=1000,
                                             max_position_embeddings=128), {}, "text", None),
    "cohere": ("CohereConfig", "CohereModel", _DECODER, {}, "text", None),
    "helium": ("HeliumConfig", "HeliumModel", dict(_DECODER, head_dim=16), {}, "text", None),
    "olmo2": ("Olmo2Config", "Olmo2Model", _DECODER, {}, "text", None),
    "deberta-v2": ("DebertaV2Config", "DebertaV2Model", dict(_TEXT, relative_attention=True, position_buckets=16,
                                                             pos_att_type=["p2c", "c2p"], max_relative_positions=32),
                   {}, "text", None),
    "albert": ("AlbertConfig", "AlbertModel", dict(_TEXT, embedding_size=32), {"add_pooling_layer": False}, "text",
               None),
    "distilbert": ("DistilBertConfig", "DistilBertModel", dict(dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                                               vocab_size=1000, max_position_embeddings=128), {},
                   "text", None),
    "electra": ("ElectraConfig", "ElectraModel", dict(_TEXT, embedding_size=32), {}, "text", None),
    "mobilenet-v2": ("MobileNetV2Config", "MobileNetV2Model", dict(image_size=32, depth_multiplier=0.35,
                                                                    initializer_range=0.2), {},
                     (1, 3, 32, 32), None),
    "efficientnet": ("EfficientNetConfig", "EfficientNetModel", dict(image_size=32, width_coefficient=0.25,
                                                                     depth_coefficient=0.2, hidden_dim=320,
                                                                     initializer_range=1.0), {},
                     (1, 3, 32, 32), None),
    "videomae": ("VideoMAEConfig", "VideoMAEModel", dict(_VISION, num_frames=4, tubelet_size=2), {},
                 ("pixel_values", 1, 4, 3, 32, 32), None),
}
EXPORTERS = ("legacy", "dynamo", "opset23", "dynamic", "dynamo-dynamic")


def _inputs(kind, batch=BATCH, seq=SEQ, vocab=1000):
    """Named torch inputs: token ids, a mask with rows of seq-2 and seq-6 valid tokens, or pixels/audio."""
    import torch

    g = torch.Generator().manual_seed(1)
    if isinstance(kind, tuple) and isinstance(kind[0], str):  # a named float input: filterbanks, time series
        return {kind[0]: torch.randn(batch if batch != BATCH else kind[1], *kind[2:], generator=g)}
    if isinstance(kind, tuple):
        shape = (batch if batch != BATCH else kind[0], *kind[1:]) if len(kind) == 4 else (batch, kind[1])
        name = "pixel_values" if len(kind) == 4 else "input_values"
        return {name: torch.randn(*shape, generator=g)}
    ids = torch.randint(3, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    for row in range(batch):
        mask[row, seq - (2 + 4 * (row % 2)):] = 0
    if kind == "text-only-ids":
        return {"input_ids": ids}
    if kind == "audio+decoder":
        return {"input_features": torch.randn(1, 16, 64, generator=g),
                "decoder_input_ids": torch.randint(3, vocab, (1, 5), generator=g)}
    out = {"input_ids": ids, "attention_mask": mask}
    if kind == "text+decoder":
        out["decoder_input_ids"] = torch.randint(3, vocab, (batch, 7), generator=g)
    return out


class _Wrapped:
    """The model's first output from inputs given positionally in ONNX order."""

    @staticmethod
    def make(model, names):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, *xs):
                out = self.m(**dict(zip(names, xs)))
                return out[0] if isinstance(out, (tuple, list)) else out.last_hidden_state

        return Wrapped().eval()


def _valid(feeds, got):
    mask = feeds.get("attention_mask")
    if mask is not None and got.ndim == 3 and got.shape[:2] == mask.shape:
        return mask.astype(bool)
    return np.ones(got.shape[:-1], bool)


class _Deployed:
    """``tvm-fusion compile``'s artifact, loaded by :func:`tvm_fusion_ext.deploy.load`, with what ``_compare``
    reads of a ``CompiledModel``."""

    def __init__(self, path, max_shapes):
        import types

        from tvm_fusion_ext.compile import compile_artifact
        from tvm_fusion_ext.deploy import load

        out = path[: -len(".onnx")] + "-artifact"
        compile_artifact(path, out, max_shapes=max_shapes)
        self.model = load(out)
        self.report = types.SimpleNamespace(fused=self.model.manifest["fusion"]["fused"])

    def run(self, feeds):
        return self.model.run(feeds)


def run_case(family: str, exporter: str, out_dir: str, artifact: bool = False) -> dict:
    import torch
    import transformers

    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.runtime import CompiledModel

    config_name, model_name, args, kwargs, kind, part = FAMILIES[family]
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(**args), **kwargs)
    model = (getattr(model, part)() if part else model).eval()
    vocab = int(args.get("vocab_size", 1000))
    inputs = _inputs(kind, vocab=vocab)
    names = list(inputs)
    wrapped = _Wrapped.make(model, names)
    path = os.path.join(out_dir, f"{family}-{exporter}.onnx")
    kw = dict(input_names=names, output_names=["out"])
    if exporter == "dynamic":
        seq_of = {"input_ids": "seq", "attention_mask": "seq", "input_values": "seq", "decoder_input_ids": "target"}
        kw["dynamic_axes"] = {n: ({0: "batch", 1: seq_of[n]} if n in seq_of else {0: "batch"}) for n in names}
    if exporter == "dynamo-dynamic":
        from torch.export import Dim

        dims = {"batch": Dim("batch", min=1, max=8), "seq": Dim("seq", min=2, max=4096 if kind == (2, 800) else 64),
                "target": Dim("target", min=2, max=64)}
        seq_of = {"input_ids": "seq", "attention_mask": "seq", "input_values": "seq", "decoder_input_ids": "target"}
        kw["dynamic_shapes"] = {"xs": tuple({0: dims["batch"], 1: dims[seq_of[n]]} if n in seq_of
                                            else {0: dims["batch"]} for n in names)}
    opset = {"legacy": 17, "dynamo": 18, "opset23": 23, "dynamic": 17, "dynamo-dynamic": 18}[exporter]
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(wrapped, tuple(inputs.values()), path,
                              dynamo=exporter in ("dynamo", "opset23", "dynamo-dynamic"),
                              opset_version=opset, **kw)
    except Exception as err:  # noqa: BLE001  (torch's exporter, not ours)
        return {"outcome": "export-failed", "detail": str(err).strip().splitlines()[0][:160]}
    try:
        # audio lengths are samples, far past the default sequence bound (512)
        max_shapes = {"input_values": [8, 4096]} if "dynamic" in exporter and "input_values" in names \
            and inputs["input_values"].ndim == 2 else None  # raw samples (AST's rank-3 filterbanks keep the default)
        if artifact:  # the deploy path: compile to an artifact directory, load it as a server would
            compiled = _Deployed(path, max_shapes)
        else:
            compiled = CompiledModel.from_module(load_onnx(path, max_shapes=max_shapes))
        return _compare(compiled, wrapped, inputs, exporter, kind, vocab, path)
    except Exception as err:  # noqa: BLE001  (our one-line errors are refusals; anything else is a failure)
        return {"outcome": "refused" if type(err).__module__.startswith("tvm_fusion_ext") else "FAIL",
                "detail": f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"}


def _compare(compiled, wrapped, inputs, exporter, kind, vocab, path) -> dict:
    import torch

    shapes = [inputs]
    if "dynamic" in exporter:  # another shape: batch 3, seq 13 (text), batch 1 (images), batch 1 of 640 (audio)
        other = (kind if isinstance(kind, str) else (kind[0], 1, *kind[2:]) if isinstance(kind[0], str)
                 else (1, *kind[1:]) if len(kind) > 2 else (1, 640))
        shapes.append(_inputs(other, batch=3 if isinstance(kind, str) else 1, seq=13, vocab=vocab))
    worst, export_differs, scale = 0.0, None, 0.0
    # an input the model never reads (MRA's mask at seq 20) is dropped by the exporter: feed the file's inputs only
    import onnx

    taken = {i.name for i in onnx.load(path, load_external_data=False).graph.input}
    for feeds_t in shapes:
        with torch.no_grad():
            ref = wrapped(*feeds_t.values()).numpy()
        feeds = {k: v.numpy() for k, v in feeds_t.items() if k in taken}
        got = next(iter(compiled.run(feeds).values()))
        if got.shape != ref.shape:
            return {"outcome": "FAIL", "detail": f"shape {got.shape} != torch's {ref.shape}"}
        valid = _valid(feeds, got)
        scale = max(scale, float(np.abs(ref[valid]).max()))
        diff = float(np.abs(got[valid] - ref[valid]).max())
        if diff > 1e-4 * max(1.0, float(np.abs(ref).max())):
            # Is the file itself unlike torch here (a trace-time value baked into a dynamic-axes export)? Then
            # ONNX Runtime, running the same file, disagrees with torch as we do, and agrees with us.
            ort_out = _run_ort(path, feeds)
            if ort_out is not None and np.allclose(got, ort_out, rtol=0, atol=1e-4 * max(1.0, np.abs(ort_out).max())):
                export_differs = f"at {tuple(got.shape)}: torch differs by {diff:.1e}, ONNX Runtime agrees with us"
                continue
        worst = max(worst, diff)
    fused = {k: v for k, v in compiled.report.fused.items() if v}
    ok = worst <= 1e-4 * max(1.0, float(np.abs(ref).max()))
    if ok and scale < 1e-3:  # random weights whose signal vanished: a match of near-zeros proves nothing
        return {"outcome": "degenerate", "detail": f"torch's output is at most {scale:.1e} in magnitude: "
                                                   "raise the family's initializer range", "max_abs_diff": worst}
    if ok and export_differs:
        return {"outcome": "export-differs", "detail": export_differs, "max_abs_diff": worst, "fused": fused,
                "scale": scale}
    return {"outcome": "ok" if ok else "FAIL", "max_abs_diff": worst, "fused": fused, "scale": scale}


def _run_ort(path, feeds):
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--exporters", default="legacy,dynamo")
    ap.add_argument("--out", default=None, help="where the exports go (default: a temporary directory)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--artifact", action="store_true",
                    help="compile each export to an artifact and run it through tvm_fusion_ext.deploy.load")
    ap.add_argument("--one", nargs=2, metavar=("FAMILY", "EXPORTER"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="tfx_families_")
    os.makedirs(out, exist_ok=True)
    if args.one:
        print("RESULT " + json.dumps(run_case(*args.one, out, artifact=args.artifact)), flush=True)
        return
    for family in args.families.split(","):
        for exporter in args.exporters.split(","):
            if family not in FAMILIES or exporter not in EXPORTERS:
                sys.exit(f"error: unknown family {family!r} or exporter {exporter!r}")
            try:
                done = subprocess.run([sys.executable, __file__, "--one", family, exporter, "--out", out]
                                      + (["--artifact"] if args.artifact else []),
                                      capture_output=True, text=True, timeout=args.timeout)
                line = next((x[7:] for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
                result = json.loads(line) if line else {"outcome": "FAIL", "detail": f"died (exit {done.returncode})"
                                                        f": {done.stderr.strip().splitlines()[-1:]}"}
            except subprocess.TimeoutExpired:
                result = {"outcome": "FAIL", "detail": f"timeout after {args.timeout:.0f} s"}
            if result["outcome"] in ("ok", "export-differs"):
                detail = (f"max |diff| {result['max_abs_diff']:.1e} of |ref| {result.get('scale', 0):.1e} "
                          f"{result['fused']} {result.get('detail', '')}")
            else:
                detail = result.get("detail") or f"max |diff| {result['max_abs_diff']:.1e}, over the tolerance"
            print(f"{family}-{exporter} {result['outcome']} {detail}", flush=True)


if __name__ == "__main__":
    main()
