"""Export every family in ``models.MODEL_FAMILIES`` with dynamic batch and sequence (both exporters, tiny random
weights), build each once, and compare with ONNX Runtime on the valid positions at several shapes and padding
patterns. Prints one line per export: ``ok`` with the largest difference and the fusion counts, or what failed.

    python scripts/sweep_dynamic_exports.py [--kinds roberta,gpt2] [--remove-padding] [--out DIR]

sdpa attention where the model has it, eager otherwise (MPNet, Gemma2, BLOOM, DeBERTa).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

SHAPES = ((1, 1, "right"), (1, 5, "right"), (3, 17, "right"), (4, 9, "left"), (2, 12, "holes"))


def _mask(rng, b: int, s: int, side: str) -> np.ndarray:
    mask = np.ones((b, s), np.int64)
    for i in range(b):
        n = int(rng.integers(1, s + 1))
        if side == "right":
            mask[i, n:] = 0
        elif side == "left":
            mask[i, :s - n] = 0
        else:
            mask[i, rng.integers(0, s, 3)] = 0
            mask[i, 0] = 1
    return mask


def _export(kind: str, exporter: str, out: str) -> str:
    from tvm_fusion_ext.models import export_hf_model

    path = os.path.join(out, f"{kind}-{exporter}.onnx")
    try:
        return export_hf_model(kind, path, exporter=exporter, attn="sdpa", seq=20, batch=2, dynamic=True, max_seq=64)
    except Exception as err:  # noqa: BLE001  (the model has no sdpa attention)
        if "sdpa" not in str(err) and "scaled_dot_product" not in str(err):
            raise
        return export_hf_model(kind, path, exporter=exporter, attn="eager", seq=20, batch=2, dynamic=True,
                               max_seq=64)


def check(path: str, remove_padding: bool) -> str:
    import onnxruntime as ort

    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.runtime import CompiledModel

    model = CompiledModel.from_module(load_onnx(path), remove_padding=remove_padding)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    rng = np.random.default_rng(0)
    worst = 0.0
    for b, s, side in SHAPES:
        mask = _mask(rng, b, s, side)
        feeds = {"input_ids": rng.integers(0, 1000, (b, s)).astype(np.int64), "attention_mask": mask,
                 "token_type_ids": np.zeros((b, s), np.int64)}
        feeds = {k: v for k, v in feeds.items() if k in names}
        got = next(iter(model.run(feeds).values()))
        ref = sess.run(None, feeds)[0]
        valid = mask.astype(bool)
        worst = max(worst, float(np.abs(got[valid] - ref[valid]).max()))
    report = model.report
    fused = {k: v for k, v in report.fused.items() if v} if report else {}
    in_place = report.count("ReadAttentionHeadsInPlace") if report else 0
    return f"ok max |diff| {worst:.1e} {fused}" + (f", attention heads read in place {in_place}" if in_place else "")


def main() -> None:
    from tvm_fusion_ext.models.hf import MODEL_FAMILIES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default=",".join(MODEL_FAMILIES))
    ap.add_argument("--remove-padding", action="store_true")
    ap.add_argument("--out", default=None, help="where the exports go (default: a temporary directory)")
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="tfx_dynamic_")
    for kind in args.kinds.split(","):
        for exporter in ("dynamo", "legacy"):
            try:
                line = check(_export(kind, exporter, out), args.remove_padding)
            except Exception as err:  # noqa: BLE001  (a sweep reports every failure and goes on)
                text = str(err).strip().splitlines()
                line = f"FAIL {type(err).__name__}: {text[-1][:200] if text else ''}"
            print(f"{kind}-{exporter} {line}", flush=True)


if __name__ == "__main__":
    main()
