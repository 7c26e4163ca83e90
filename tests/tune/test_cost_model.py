"""Cost-model choice of the tuner (``--cost-model xgb|random``) and the attention kernel as a tuning task."""

from __future__ import annotations

import json
import os

import pytest

ENCODER = dict(num_layers=1, hidden=32, heads=2, intermediate=64, seq=16)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    import onnx

    from tvm_fusion_ext.models import build_encoder_onnx

    path = str(tmp_path_factory.mktemp("model") / "tiny.onnx")
    onnx.save(build_encoder_onnx(**ENCODER), path)
    return path


def test_random_cost_model_from_cli_writes_records_and_manifest(tiny_path, tmp_path):
    from tvm_fusion_ext.cli import main
    from tvm_fusion_ext.tune.logs import open_database

    logs = tmp_path / "logs"
    assert main(["tune", tiny_path, "--target", "llvm", "--trials", "4", "--per-iter", "2", "--population", "16",
                 "--cost-model", "random", "--logs", str(logs)]) == 0
    (sub,) = [d for d in os.listdir(logs) if d.startswith("tiny-")]
    path = os.path.join(logs, sub)
    with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["cost_model"] == "random"
    records = open_database(path).get_all_tuning_records()
    assert len(records) == manifest["trials"] == 4
    measured = [t for t in manifest["tasks"].values() if t["trials"] > 0]
    assert measured and all(t["best_us"] is not None for t in measured)
    # random scores are not predictions: no rank correlation may be reported for them
    assert all((t.get("quality") or {}).get("predicted_pairs", 0) == 0 for t in measured)


def test_unknown_cost_model_is_rejected(tiny_path, tmp_path):
    from tvm_fusion_ext.cli import main
    from tvm_fusion_ext.errors import FusionExtError
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.tune.driver import TuneOptions, tune

    with pytest.raises(SystemExit):
        main(["tune", tiny_path, "--cost-model", "gbdt", "--logs", str(tmp_path)])
    with pytest.raises(FusionExtError, match="cost model"):
        tune(load_onnx(tiny_path), "llvm", logs=str(tmp_path), options=TuneOptions(cost_model="gbdt", progress=None))
    assert not os.listdir(tmp_path)  # rejected before anything was written


def test_attention_kernel_is_a_tuning_task(tiny_path):
    """The fused attention kernel has no Let expression any more, so MetaSchedule can count its FLOPs and the
    driver hands it to the tuner with its template space instead of skipping it."""
    from tvm_fusion_ext.build import lower
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.targets import resolve_target
    from tvm_fusion_ext.transform.pipeline import SemanticFusion
    from tvm_fusion_ext.tune.driver import extract_tasks

    target = resolve_target("llvm")
    tasks, skipped = extract_tasks(lower(SemanticFusion()(load_onnx(tiny_path)), target), target)
    attention = [t for t in tasks if t.rule is not None and "attention" in t.rule]
    assert len(attention) == 1, ([t.name for t in tasks], skipped)
    assert attention[0].flops is not None and attention[0].flops > 0
    assert not any("attention" in name for name, _ in skipped)
