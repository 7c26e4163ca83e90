"""Workloads for demos, benchmarks and tests: the built-in encoder, real Hugging Face encoders and their ONNX
exports, and valid sample inputs. Nothing in the compile path imports this package.

===========  ==================================================================================
``encoder``  built with ``onnx.helper`` (no torch): the tiny BERT-style encoder, single dense layers
``hf``       all-MiniLM-L6-v2 / BERT-base / tiny RoBERTa-family encoders and LLaMA / Qwen2 / ModernBERT
             models (torch + transformers), ONNX exports
``causal_lm`` random-weight LLaMA causal LMs with a KV cache, exported as Optimum exports decoders
``inputs``   valid inputs for an ONNX encoder by input name
===========  ==================================================================================
"""

from .causal_lm import CAUSAL_LM_SIZES, causal_lm, export_causal_lm
from .encoder import DEFAULT_MODEL_NAME, build_dense_onnx, build_encoder_onnx, default_model_path
from .hf import (DECODER_FAMILIES, ENCODER_FAMILIES, HF_EXPORT_KEY, HF_KINDS, OTHER_FAMILIES, export_hf_model, hf_example_inputs,
                 hf_input_names, hf_model, minilm_weights_dir)
from ..frontend.sample_inputs import padding_mask, sample_inputs, vocab_size

__all__ = ["CAUSAL_LM_SIZES", "DECODER_FAMILIES", "DEFAULT_MODEL_NAME", "ENCODER_FAMILIES", "HF_EXPORT_KEY", "HF_KINDS", "OTHER_FAMILIES", "build_dense_onnx", "build_encoder_onnx", "causal_lm",
           "default_model_path", "export_causal_lm", "export_hf_model", "hf_example_inputs", "hf_input_names", "hf_model", "minilm_weights_dir",
           "padding_mask", "sample_inputs", "vocab_size"]
