"""Which exports run padding-free: every encoder family, both torch exporters, dynamic batch and sequence.

For each (family, exporter) the export is fused with ``remove_padding=True`` and the table says whether the
padding was removed, how many attentions run packed per sequence (the mask proven key-only) out of how many, and
otherwise the reason the proof gave. ``--check`` also builds the padding-free model and compares it with ONNX
Runtime at the valid positions of mixed right/left/holed masks (padded positions must be exactly 0).

    python scripts/sweep_padding_free.py [--kinds minilm,roberta] [--exporters dynamo,legacy] [--check] [--out DIR]

Tiny random weights (two layers) except MiniLM (real weights, two layers) and BERT-base (random, two layers);
sdpa attention where the family has it, eager otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

#: the encoders: MiniLM and BERT-base first, then the families of models.ENCODER_FAMILIES and the encoders among
#: OTHER_FAMILIES / DECODER_FAMILIES (relative position biases, rotary)
KINDS = ("minilm", "bert-base", "roberta", "xlm-roberta", "electra", "albert", "distilbert", "mpnet", "t5-encoder",
         "deberta-v2", "modernbert")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package

SHAPES = ((1, 1, "right"), (3, 17, "right"), (4, 9, "left"), (2, 12, "holes"))


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


def export(kind: str, exporter: str, out: str) -> str:
    from tvm_fusion_ext.models import export_hf_model

    path = os.path.join(out, f"{kind}-{exporter}.onnx")
    if os.path.exists(path):
        return path
    kw = dict(exporter=exporter, seq=20, batch=2, dynamic=True, max_seq=64)
    if kind in ("minilm", "bert-base"):  # the others are tiny two-layer models already
        kw["num_layers"] = 2
    try:
        return export_hf_model(kind, path, attn="sdpa", **kw)
    except Exception as err:  # noqa: BLE001  (the model has no sdpa attention)
        if "sdpa" not in str(err) and "scaled_dot_product" not in str(err):
            raise
        return export_hf_model(kind, path, attn="eager", **kw)


def prove(path: str):
    """``(padding removed, packed attentions, attentions, reason)`` from fusing with ``remove_padding=True``."""
    from tvm_fusion_ext.compile import fuse
    from tvm_fusion_ext.frontend import load_onnx

    _, report = fuse(load_onnx(path), remove_padding=True)
    attentions = report.fused.get("attention", 0)
    reasons = [e.detail for e in report.refused if e.rule in ("RemovePadding", "VarlenAttention")]
    if not attentions and not reasons:  # RemovePadding looks only at graphs with a fused attention
        reasons = ["no fused attention (the attention rule did not match): nothing to pack around"]
    return bool(report.padding_removed), report.varlen_attention, attentions, reasons[0] if reasons else ""


def check(path: str) -> float:
    """Largest |difference| from ONNX Runtime at valid positions; raises if a padded position is not 0."""
    import onnxruntime as ort

    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.runtime import CompiledModel

    model = CompiledModel.from_module(load_onnx(path), remove_padding=True)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    rng = np.random.default_rng(0)
    worst = 0.0
    for b, s, side in SHAPES:
        mask = _mask(rng, b, s, side)
        feeds = {"input_ids": rng.integers(3, 1000, (b, s)).astype(np.int64), "attention_mask": mask,
                 "token_type_ids": np.zeros((b, s), np.int64)}
        feeds = {k: v for k, v in feeds.items() if k in names}
        got = next(iter(model.run(feeds).values()))
        ref = sess.run(None, feeds)[0]
        valid = mask.astype(bool)
        if np.any(got[~valid] != 0):
            raise AssertionError("padded positions are not 0")
        worst = max(worst, float(np.abs(got[valid] - ref[valid]).max()))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--exporters", default="dynamo,legacy")
    ap.add_argument("--check", action="store_true", help="also compare the padding-free build with ONNX Runtime")
    ap.add_argument("--out", default=None, help="where the exports go (default: a temporary directory)")
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="tfx_padfree_")
    print("| family | exporter | padding removed | packed attentions | max abs diff vs ORT | reason |")
    print("|---|---|---|---|---|---|")
    for kind in args.kinds.split(","):
        for exporter in args.exporters.split(","):
            try:
                removed, packed, total, reason = prove(export(kind, exporter, out))
                diff = f"{check(export(kind, exporter, out)):.1e}" if args.check and removed else "—"
                cells = ["yes" if removed else "no", f"{packed} / {total}" if removed else f"0 / {total}", diff,
                         reason.replace("|", "\\|")]
            except Exception as err:  # noqa: BLE001  (a sweep reports every failure and goes on)
                text = str(err).strip().splitlines()
                cells = ["FAIL", "", "", f"{type(err).__name__}: {text[-1][:160] if text else ''}"]
            print(f"| {kind} | {exporter} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
