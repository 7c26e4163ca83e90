"""A Python module pass receives the caller's IRModule object: none of ours may change it in place."""

from tvm import relax

from tvm_fusion_ext.compile import ApplyTemplates, VectorisableMath, lower
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.models import build_encoder_onnx
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.transform import SemanticFusion
from tvm_fusion_ext.transform.safe_gather import ClampGatherIndices


def _snapshot(mod):
    return {gv.name_hint: f.script(show_meta=False) for gv, f in mod.functions_items()}


def test_no_pass_mutates_its_input():
    target = resolve_target("llvm")
    mod = load_onnx(build_encoder_onnx(num_layers=1, hidden=32, heads=2, intermediate=64, seq=8))
    steps = [ClampGatherIndices(), SemanticFusion()]
    for p in steps:
        before = _snapshot(mod)
        out = p(mod)
        assert _snapshot(mod) == before, f"{p.info.name} changed its input"
        mod = out
    lowered = lower(mod, target)
    for p in (VectorisableMath(target), ApplyTemplates(target)):
        before = _snapshot(lowered)
        p(lowered)
        assert _snapshot(lowered) == before, f"{p.info.name} changed its input"
    assert isinstance(lowered["main"], relax.Function)
