"""The template's expert defaults are measured first, so a tuned build is never worse than the defaults as far
as measurement can tell (the search itself samples fresh decisions and would never try them)."""

import json
import os

import tvm
from tvm import s_tir

from tvm_fusion_ext.compile import lower
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.models import build_encoder_onnx
from tvm_fusion_ext.schedules import template_rules
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.transform import SemanticFusion
from tvm_fusion_ext.tune.driver import TuneOptions, tune
from tvm_fusion_ext.records import open_database


def _default_decisions(func, target):
    for template in template_rules(target):
        sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
        block = template.find_block(sch)
        if block is not None:
            template(sch, block, target)
            return sorted(str(v) for v in sch.trace.decisions.values())
    return None


def test_each_template_task_starts_with_its_defaults(tmp_path):
    target = resolve_target("llvm")
    mod = load_onnx(build_encoder_onnx(num_layers=1, hidden=32, heads=2, intermediate=64, seq=16))
    lowered = lower(SemanticFusion()(mod), target)
    defaults = [d for d in (_default_decisions(f, target) for _, f in lowered.functions_items()
                            if isinstance(f, tvm.tirx.PrimFunc)) if d is not None]
    manifest = tune(mod, target, str(tmp_path), "tiny", TuneOptions(trials=len(defaults), per_iter=4))
    out = next(p for p in tmp_path.iterdir() if p.is_dir())
    db = open_database(str(out))
    records = db.get_all_tuning_records()
    assert len(records) == len(defaults) == manifest["trials"]
    recorded = sorted(sorted(str(v) for v in r.trace.decisions.values()) for r in records)
    assert recorded == sorted(defaults)  # exactly the template defaults, one per task, all measured
    assert all(r.run_secs and float(r.run_secs[0]) > 0 for r in records)
    assert json.load(open(os.path.join(out, "manifest.json")))["trials"] == len(defaults)
