"""Lowering runs a kernel the graph repeats on the same inputs once: an SDPA export rebuilds the additive mask in
every layer (``Where(mask, 0, -inf)``), and the attention rule reduces each copy to its key-only form."""

import numpy as np
import onnxruntime as ort
import pytest
import tvm
import tvm_ffi
from tvm import relax

from tvm_fusion_ext.compile import prepare
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.models import build_encoder_onnx
from tvm_fusion_ext.runtime import CompiledModel


def _repeated_calls(mod):
    """Kernel calls of ``main`` that another call before them already made with the same arguments."""
    seen, repeated = [], []

    def visit(expr):
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.call_tir":
            call = relax.Tuple([expr.args[0], *expr.args[1].fields])
            if any(tvm_ffi.structural_equal(call, other, map_free_vars=False) for other in seen):
                repeated.append(expr.args[0].name_hint)
            seen.append(call)

    relax.analysis.post_order_visit(mod["main"], visit)
    return repeated


@pytest.fixture(scope="module")
def sdpa_encoder():
    return build_encoder_onnx(num_layers=3, batch=2, seq=8, attention="sdpa")


def test_the_mask_every_layer_rebuilds_is_computed_once(sdpa_encoder, monkeypatch):
    mod = load_onnx(sdpa_encoder)
    assert _repeated_calls(prepare(mod, "llvm")[0]) == []
    # the same lowering without the merge repeats the mask kernel in the two later layers: the case is real
    monkeypatch.setattr(relax.transform, "EliminateCommonSubexpr", lambda: tvm.transform.Sequential([]))
    assert len(_repeated_calls(prepare(mod, "llvm")[0])) == 2


def test_the_merged_build_matches_onnx_runtime(sdpa_encoder):
    rng = np.random.default_rng(0)
    mask = np.ones((2, 8), np.int64)
    mask[1, 5:] = 0
    feeds = {"input_ids": rng.integers(0, 100, (2, 8)).astype(np.int64), "attention_mask": mask}
    want = ort.InferenceSession(sdpa_encoder.SerializeToString()).run(None, feeds)[0]
    got = CompiledModel.from_module(load_onnx(sdpa_encoder)).run(feeds)
    np.testing.assert_allclose(got["last_hidden_state"], want, rtol=1e-4, atol=1e-4)
