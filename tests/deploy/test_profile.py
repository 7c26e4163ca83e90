"""``deploy.profile_kernels``: each kernel of a call timed inside the VM. Checked by what can be known without a
clock: the launches the fusion report predicts, the exact work of each dense kernel, the totals adding up; and
the same profile from a model built in this process. No timing thresholds."""

from __future__ import annotations

import types

import numpy as np
import pytest

from tvm_fusion_ext.deploy import load, profile_kernels
from tvm_fusion_ext.deploy.profile import VM_BOOKKEEPING, dense_gflops
from tvm_fusion_ext.models import sample_inputs


def _calls(profile, prefix):
    return sum(k.calls for k in profile.kernels if k.name.startswith(prefix))


def _encoder_dense_gflop(hidden=64, intermediate=128, layers=2, tokens=32):
    # per layer: the horizontal QKV projection, the output projection, the two FFN matmuls (2·M·N·K each)
    per_layer = hidden * 3 * hidden + hidden * hidden + 2 * hidden * intermediate
    return 2.0 * tokens * per_layer * layers / 1e9


def test_artifact_profile_counts_the_fused_launches_and_their_work(tiny_artifact):
    model = load(tiny_artifact)
    fused = model.manifest["fusion"]["fused"]
    profile = profile_kernels(model, sample_inputs(model.manifest["source"]["path"], seed=1), runs=3)
    names = [k.name for k in profile.kernels]
    assert len(names) == len(set(names)) and names[-1] == VM_BOOKKEEPING  # one row per kernel, bookkeeping last
    # every fused operator is one launch per occurrence: the profile sees what the fusion report counted
    assert _calls(profile, "fused_dense") == fused["dense"] == 8
    assert _calls(profile, "fused_attention") == fused["attention"]
    assert _calls(profile, "fused_layernorm") == fused["layernorm"]
    assert sum(k.gflops or 0 for k in profile.kernels) == pytest.approx(_encoder_dense_gflop(), rel=1e-12)
    assert all(k.gflop_per_s > 0 for k in profile.kernels if k.name.startswith("fused_dense"))
    assert all(k.gflops is None for k in profile.kernels if not k.name.startswith("fused_dense"))
    # medians of per-call sums: positive, and ordered slowest first among the compiled kernels
    compiled = [k.ms for k in profile.kernels if k.name != VM_BOOKKEEPING]
    assert min(compiled) > 0 and compiled == sorted(compiled, reverse=True)
    d = profile.to_dict()
    assert d["runs"] == 3 and d["kernels_ms"] == pytest.approx(sum(k["ms"] for k in d["kernels"]))
    assert sum(k["share"] for k in d["kernels"]) == pytest.approx(1.0)
    assert d["call_ms"] > 0 and d["profiled_call_ms"] > 0


def test_table_folds_the_tail_and_keeps_bookkeeping_last(tiny_artifact):
    model = load(tiny_artifact)
    profile = profile_kernels(model, sample_inputs(model.manifest["source"]["path"], seed=1), runs=2)
    compiled = [k for k in profile.kernels if k.name != VM_BOOKKEEPING]
    lines = profile.table(top=3).splitlines()
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| kernel")]
    assert [r.split(" | ")[0][2:] for r in rows[:3]] == [k.name for k in compiled[:3]]
    folded = len(compiled) - 3
    assert rows[3].startswith(f"| {folded} other kernels | {sum(k.calls for k in compiled[3:])} |")
    assert rows[4].startswith(f"| {VM_BOOKKEEPING} |") and len(rows) == 5
    assert lines[-1].startswith("kernels ") and "un-instrumented call" in lines[-1]


def test_a_model_built_in_process_profiles_alike(tiny_onnx):
    from tvm_fusion_ext.runtime import CompiledModel

    built = CompiledModel.from_onnx(tiny_onnx)
    profile = profile_kernels(built, sample_inputs(tiny_onnx, seed=2), runs=2)
    assert _calls(profile, "fused_dense") == built.report.fused["dense"]
    assert sum(k.gflops or 0 for k in profile.kernels) == pytest.approx(_encoder_dense_gflop(), rel=1e-12)


@pytest.mark.parametrize("n", [1, 37])
def test_a_symbolic_unfused_artifact_profiles_at_any_length(symbolic_artifact, n):
    """No fused operator, two outputs, a run-time dim: every launch is still counted once per call, and the profile
    leaves the model's results alone (its own VM; the same inputs give the same outputs after it)."""
    from _artifacts import symbolic_feeds

    model = load(symbolic_artifact[0])
    feeds = symbolic_feeds(n)
    before = model.run(feeds)
    profile = profile_kernels(model, feeds, runs=2)
    compiled = [k for k in profile.kernels if k.name != VM_BOOKKEEPING]
    assert compiled and all(k.calls >= 1 and k.ms > 0 and k.gflops is None for k in compiled)
    after = model.run(feeds)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])


def test_profile_refuses_bad_inputs_before_running(tiny_artifact):
    from tvm_fusion_ext.errors import InputError

    model = load(tiny_artifact)
    with pytest.raises(InputError, match="missing input"):
        profile_kernels(model, {"input_ids": np.zeros((1, 32), "int64")})
    with pytest.raises(InputError, match="the model was built for"):
        profile_kernels(model, {k: np.concatenate([v, v], axis=1) for k, v in
                                sample_inputs(model.manifest["source"]["path"]).items()})
    with pytest.raises(ValueError, match="runs must be positive"):
        profile_kernels(model, sample_inputs(model.manifest["source"]["path"]), runs=0)


def _t(shape, dtype="float32"):
    return types.SimpleNamespace(shape=tuple(shape), dtype=dtype)


@pytest.mark.parametrize("name,args,expected", [
    ("fused_dense3", [_t([2, 5, 7]), _t([9, 7]), _t([2, 5, 11])], 2 * 2 * 5 * 11 * 7 / 1e9),
    ("fused_dense_gelu1", [_t([4, 6]), _t([1, 6, 16]), _t([16]), _t([4, 8])], 2 * 4 * 8 * 6 / 1e9),
    ("fused_attention2", [_t([2, 5, 7]), _t([2, 5, 7])], None),          # not a dense kernel
    ("fused_dense", [_t([2, 5, 7]), _t([9, 7]), _t([5, 11])], None),     # rows do not match: no claim
    ("fused_dense", [_t([5, 7], "float16"), _t([5, 11], "float16")], None),  # fp32 only
    ("fused_dense", [_t([7])], None),
])
def test_dense_work_from_arguments(name, args, expected):
    got = dense_gflops(name, args)
    assert got == (pytest.approx(expected, rel=1e-12) if expected is not None else None)
