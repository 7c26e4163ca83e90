"""A LLaMA-shaped decoder (models/causal_lm: grouped K/V heads, rotary, KV cache, dynamic batch and lengths)
built once runs its decode steps with the split-K decode kernel: every attention kernel carries the one-row
branch, and decode steps (past 0, 1, 9 and 70, a left-padded sequence) and a prefill chunk match ONNX Runtime."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_fusion_ext.compile.finalize import finalize
from tvm_fusion_ext.compile.pipeline import prepare
from tvm_fusion_ext.compile.schedule import schedule
from tvm_fusion_ext.compile.variants.decode import DECODE_ATTR
from tvm_fusion_ext.frontend import load_onnx
from tvm_fusion_ext.models.causal_lm import past_names
from tvm_fusion_ext.ops.registry import op_of
from tvm_fusion_ext.targets import resolve_target

ort = pytest.importorskip("onnxruntime")

TARGET = resolve_target({"kind": "llvm", "num-cores": 2})
LAYERS, KV_HEADS, HEAD_DIM, VOCAB = 2, 2, 16, 1000  # models/causal_lm's "tiny"


def _feeds(batch, new, past, seed):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, past + new), "int64")
    if batch > 1 and past >= 2:
        mask[-1, :2] = 0  # the last sequence left-padded: its first two cached positions are padding
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)[:, past:]
    feeds = {"input_ids": rng.integers(3, VOCAB, (batch, new)).astype("int64"), "attention_mask": mask,
             "position_ids": positions.astype("int64")}
    for name in past_names(LAYERS):
        feeds[name] = rng.standard_normal((batch, KV_HEADS, past, HEAD_DIM)).astype("float32")
    return feeds


@pytest.mark.slow  # a symbolic decoder build with every run-time branch: ~1-2 min on 2 cores
def test_decoder_steps_use_the_decode_kernel_and_match_onnxruntime(tiny_causal_lm):
    scheduled = schedule(prepare(load_onnx(tiny_causal_lm), TARGET)[0], TARGET)
    attention = [f for _, f in scheduled.functions_items()
                 if isinstance(f, tvm.tirx.PrimFunc) and op_of(f) == "fused_attention"]
    assert attention and all(DECODE_ATTR in f.attrs for f in attention), [dict(f.attrs) for f in attention]
    vm = relax.VirtualMachine(finalize(scheduled, TARGET), tvm.cpu())
    session = ort.InferenceSession(tiny_causal_lm, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for batch, new, past in ((1, 1, 0), (2, 1, 1), (3, 1, 9), (2, 1, 70), (2, 3, 5)):
        feeds = _feeds(batch, new, past, seed=batch * 100 + past)
        want = session.run(None, feeds)
        got = vm["main"](*[tvm.runtime.tensor(feeds[n]) for n in names])
        logits = got[0].numpy()
        np.testing.assert_allclose(logits, want[0], rtol=1e-4, atol=1e-4,
                                   err_msg=f"logits at (batch, new, past) = {(batch, new, past)}")
