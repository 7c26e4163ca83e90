"""Random-weight causal language models with a KV cache, exported to ONNX as Optimum exports them for generation.

The file takes ``input_ids [batch, sequence_length]``, ``attention_mask [batch, total_sequence_length]``,
``position_ids [batch, sequence_length]`` and, per layer, ``past_key_values.{i}.key`` / ``.value``
``[batch, kv_heads, past_sequence_length, head_dim]``; it returns ``logits [batch, sequence_length, vocab]`` and
``present.{i}.key`` / ``.value`` (the past with the new tokens' keys and values appended). A generation loop
feeds ``present`` back as the next step's past. These are the names and layouts Optimum's and ONNX Runtime
GenAI's decoders use, so code that drives these files drives theirs.

``CAUSAL_LM_SIZES`` has the tiny model the tests use (seconds to export and compile) and a LLaMA-shaped one
whose weights (about 620 MB in fp32) are far larger than a CPU's last-level cache: the size the decode benchmark
measures memory-bound steps on.
"""

from __future__ import annotations

import os

from ..errors import ModelLoadError

#: LLaMA configurations by name: ``tiny`` for tests, ``llama-1024`` for decode measurements
CAUSAL_LM_SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256),
    "llama-1024": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                       num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096),
}
#: ONNX metadata_props key recording the export's configuration (JSON), read back by :func:`causal_lm_info`
CAUSAL_LM_KEY = "tvm_fusion_ext.causal_lm"


def past_names(layers: int) -> list:
    return [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def present_names(layers: int) -> list:
    return [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def causal_lm(size: str = "tiny", seed: int = 0, **overrides):
    """``(torch LlamaForCausalLM in eval mode, config)`` with random weights from ``torch.manual_seed(seed)``."""
    if size not in CAUSAL_LM_SIZES:
        raise ModelLoadError(f"unknown causal LM size {size!r}; expected one of {', '.join(CAUSAL_LM_SIZES)}")
    try:
        import torch
        import transformers
    except ImportError as err:
        raise ModelLoadError(f"a causal LM needs torch and transformers ({err.name} is not installed)") from None
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**{**CAUSAL_LM_SIZES[size], **overrides}, bos_token_id=1, eos_token_id=2,
                                      pad_token_id=0)
    config._attn_implementation = "sdpa"
    return transformers.LlamaForCausalLM(config).eval(), config


def _with_cache(model, config):
    import torch
    from transformers import DynamicCache

    layers = config.num_hidden_layers

    class WithCache(torch.nn.Module):
        """(input_ids, attention_mask, position_ids, past k/v per layer) -> (logits, present k/v per layer)."""

        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(config=config)
            for layer in range(layers):
                cache.update(past[2 * layer], past[2 * layer + 1], layer)
            out = self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
            present = []
            for layer in out.past_key_values.layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    return WithCache().eval()


def export_causal_lm(path: str | os.PathLike, size: str = "tiny", seed: int = 0, **overrides) -> str:
    """Export :func:`causal_lm` with its KV cache as ONNX (torch's legacy exporter, opset 17, one file) and
    return the path. Batch, new length and past length are dynamic (named as above)."""
    import contextlib
    import io
    import json
    import warnings

    import onnx
    import torch

    from ..fileio import atomic_write_bytes

    model, config = causal_lm(size, seed, **overrides)
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    head_dim = config.hidden_size // config.num_attention_heads
    batch, new, past = 2, 3, 4
    example = [torch.randint(3, config.vocab_size, (batch, new)), torch.ones(batch, past + new, dtype=torch.int64),
               torch.arange(past, past + new).repeat(batch, 1)]
    example += [torch.randn(batch, kv_heads, past, head_dim) for _ in range(2 * layers)]
    inputs = ["input_ids", "attention_mask", "position_ids", *past_names(layers)]
    outputs = ["logits", *present_names(layers)]
    axes = {"input_ids": {0: "batch_size", 1: "sequence_length"},
            "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
            "position_ids": {0: "batch_size", 1: "sequence_length"},
            "logits": {0: "batch_size", 1: "sequence_length"},
            **{n: {0: "batch_size", 2: "past_sequence_length"} for n in past_names(layers)},
            **{n: {0: "batch_size", 2: "total_sequence_length"} for n in present_names(layers)}}
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(_with_cache(model, config), tuple(example), path, dynamo=False, opset_version=17,
                          input_names=inputs, output_names=outputs, dynamic_axes=axes)
    proto = onnx.load(path)
    info = dict(size=size, seed=seed, overrides=overrides, layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                max_position_embeddings=int(config.max_position_embeddings))
    onnx.helper.set_model_props(proto, {**{p.key: p.value for p in proto.metadata_props},
                                        CAUSAL_LM_KEY: json.dumps(info, sort_keys=True)})
    atomic_write_bytes(path, proto.SerializeToString())
    return path
