"""Models built with ``onnx.helper``, no torch needed: the built-in tiny BERT-style encoder (in the same spellings
the PyTorch exporters use, so fusion rules are exercised on realistic graphs) and single dense layers."""

from __future__ import annotations

import math
import os

import numpy as np

from ..errors import ModelLoadError
from ..fileio import atomic_write_bytes

DEFAULT_MODEL_NAME = "tiny-bert"
_CACHE_ENV = "TVM_FUSION_EXT_CACHE"
_OPSET = 17
_IR_VERSION = 8  # readable by every onnxruntime we compare against


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

