"""The kernels candidate pools are collected for, built the way the real build lowers them.

Each named task is a small Relax module holding one fused operator of a real model's shape, lowered by
``compile.prepare`` and cut into tasks by the tuner's ``extract_tasks``: the PrimFunc is the one ``tvm-fusion
tune`` tunes for that model (packed constant weights, vectorisable math), not a hand-made look-alike.

==================  =====================================================================================
``minilm-ffn``      all-MiniLM-L6-v2's FFN up-projection: dense 128×384×1536 + bias + erf-GELU
``minilm-attention`` its attention at seq 128: 12 heads, head dim 32, BSHD q/k/v/out, additive [1,1,1,S]
                    mask, scale 1/√32 (as the legacy SDPA export gives it)
``bert-ffn``        BERT-base's FFN up-projection: dense 128×768×3072 + bias + erf-GELU
``bert-attention``  BERT-base's attention at seq 128: 12 heads, head dim 64 (a transfer source for
                    ``minilm-attention``: the same template at another model's shape)
``tiny-dense``      dense 8×16×32 + GELU: seconds per candidate, for tests
==================  =====================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List

import tvm

from ...errors import FusionExtError


@dataclass(frozen=True)
class PoolTask:
    name: str
    describe: str
    build: Callable[[], tvm.IRModule]   # the unfused Relax module (SemanticFusion runs on it)
    rule: str                           # the schedule rule of the kernel to take from the lowered module


def _dense(m: int, k: int, n: int) -> Callable[[], tvm.IRModule]:
    def build():
        from ...frontend import load_onnx
        from ...models import build_dense_onnx

        return load_onnx(build_dense_onnx(m, k, n))

    return build


def _attention(seq: int, heads: int, head_dim: int, scale: float) -> Callable[[], tvm.IRModule]:
    """fused_attention as SemanticFusion emits it for a BSHD export (see ``transform/attention.py``)."""

    def build():
        from tvm import relax

        from ...ops import call_op

        bb = relax.BlockBuilder()
        qkv = [relax.Var(n, relax.TensorType((1, seq, heads, head_dim), "float32")) for n in ("q", "k", "v")]
        mask = relax.Var("mask", relax.TensorType((1, 1, 1, seq), "float32"))
        params = {"scale": scale, "causal": False, "q_layout": "BSHD", "k_layout": "BSHD", "v_layout": "BSHD",
                  "out_layout": "BSHD"}
        with bb.function("main", [*qkv, mask]):
            with bb.dataflow():
                out = bb.emit_output(call_op(bb, "fused_attention", dict(zip(("q", "k", "v"), qkv), mask=mask),
                                             params))
            bb.emit_func_output(out)
        return bb.get()

    return build


# The legacy SDPA export scales Q and Kᵀ by fp32(32^-¼) each; their product, as the PrimFunc embeds it, is
# not fp32(1/√32) (0.17677669...), and the task key is the structure including this constant.
_SDPA_SCALE_D32 = 0.1767767071723938

TASKS: Dict[str, PoolTask] = {t.name: t for t in (
    PoolTask("minilm-ffn", "MiniLM FFN dense 128x384x1536 + bias + GELU", _dense(128, 384, 1536), "tfx.dense"),
    PoolTask("minilm-attention", "MiniLM attention, seq 128, 12 heads x 32, BSHD, additive mask",
             _attention(128, 12, 32, _SDPA_SCALE_D32), "tfx.attention"),
    PoolTask("bert-ffn", "BERT-base FFN dense 128x768x3072 + bias + GELU", _dense(128, 768, 3072), "tfx.dense"),
    PoolTask("bert-attention", "BERT-base attention, seq 128, 12 heads x 64, BSHD, additive mask",
             _attention(128, 12, 64, 0.125), "tfx.attention"),
    PoolTask("tiny-dense", "dense 8x16x32 + bias + GELU (tests)", _dense(8, 16, 32), "tfx.dense"),
)}


def task_names() -> List[str]:
    return list(TASKS)


def get_task(name: str, target):
    """The driver ``Task`` of pool task ``name`` on ``target`` (design spaces not generated yet)."""
    from ...compile import prepare
    from ...tune.tasks import extract_tasks

    if name not in TASKS:
        raise FusionExtError(f"unknown pool task '{name}' (known: {', '.join(TASKS)})")
    spec = TASKS[name]
    tasks, _ = extract_tasks(prepare(spec.build(), target)[0], target)
    found = [t for t in tasks if t.rule == spec.rule]
    if len(found) != 1:
        raise FusionExtError(f"pool task '{name}': expected one {spec.rule} kernel after lowering, "
                             f"found {[t.name for t in tasks]}")
    return found[0]
