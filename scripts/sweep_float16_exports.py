"""Float16 exports (``model.half()``, torch's dynamo exporter) of families from ``sweep_unnamed_families.py``
(tiny random weights): how far the fused build, torch's own float16 run and ONNX Runtime each are from torch's
float32 answer, at valid positions. The sweep behind docs/exporter-notes.md, "Float16 models".

    python scripts/sweep_float16_exports.py [--families vit,gpt2,...]

One line per family: ``ours`` (fused), ``unfused`` (stock lowering of the same file), ``torch16`` and ``ort``,
each the largest |difference| from float32 torch, and the fusion counts. Each family runs in its own process.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep_unnamed_families import FAMILIES, _inputs, _valid, _Wrapped  # noqa: E402

DEFAULT = "vit,clip-text,gpt2,llama,qwen3,phi3,bert,mistral,dinov2,swin"


def run_case(family: str, out_dir: str) -> dict:
    import onnxruntime as ort
    import torch
    import transformers

    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.runtime import CompiledModel

    config_name, model_name, args, kwargs, kind, part = FAMILIES[family]
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(**args), **kwargs)
    model = (getattr(model, part)() if part else model).eval()
    inputs = _inputs(kind, vocab=int(args.get("vocab_size", 1000)))
    names = list(inputs)
    with torch.no_grad():
        ref32 = _Wrapped.make(model, names)(*inputs.values()).float().numpy()
    half = _Wrapped.make(model.half(), names)
    inputs = {k: v.half() if v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        ref16 = half(*inputs.values()).float().numpy()
    path = os.path.join(out_dir, f"{family}-fp16.onnx")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(half, tuple(inputs.values()), path, input_names=names, output_names=["out"],
                          dynamo=True, opset_version=18)
    feeds = {k: v.numpy() for k, v in inputs.items()}
    valid = _valid(feeds, ref32)

    def worst(x):
        return float(np.abs(np.asarray(x, np.float32) - ref32)[valid].max())

    out = {"torch16": worst(ref16),
           "ort": worst(ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0])}
    for name, fused in (("ours", True), ("unfused", False)):
        compiled = CompiledModel.from_module(load_onnx(path), fuse=fused)
        out[name] = worst(next(iter(compiled.run(feeds).values())))
        if fused:
            out["fused"] = {k: v for k, v in compiled.report.fused.items() if v}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=DEFAULT)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    out_dir = tempfile.mkdtemp(prefix="tfx_fp16_")
    if args.one:
        print("RESULT " + json.dumps(run_case(args.one, out_dir)), flush=True)
        return
    for family in args.families.split(","):
        if family not in FAMILIES:
            sys.exit(f"error: unknown family {family!r}")
        done = subprocess.run([sys.executable, __file__, "--one", family], capture_output=True, text=True,
                              timeout=900)
        line = next((x[7:] for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"{family:12s} FAIL {tail[:200]}", flush=True)
            continue
        r = json.loads(line)
        print(f"{family:12s} ours {r['ours']:.4f}  unfused {r['unfused']:.4f}  torch16 {r['torch16']:.4f}  "
              f"ort {r['ort']:.4f}  fused {r['fused']}", flush=True)


if __name__ == "__main__":
    main()
