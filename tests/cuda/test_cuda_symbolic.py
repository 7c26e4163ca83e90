"""CUDA templates take kernels whose batch and sequence are known only at run time (a dynamic-axes export):
dense pads its rows to whole row tiles, attention its query rows to whole query tiles (and carries its one-row
branch, the split-K decode kernels), the norms put the symbolic row count on ``blockIdx.x``. Each compiles with
nvcc for sm_80 and sm_90 with no spills, and no template declines (a declined kernel would silently take the
generic fallback)."""

import logging
import shutil

import pytest
from tvm import relax, tirx

from tvm_fusion_ext.compile.pipeline import compile_model
from tvm_fusion_ext.ops import call_op
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.testing import build_module
from tvm_fusion_ext.tools.inspect_cuda import cuda_sources, kernel_report

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


@pytest.fixture(autouse=True)
def _nvcc_mode(monkeypatch):
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")


def _dims():
    return tirx.Var("batch", "int64"), tirx.Var("seq", "int64")


def _compile(calls, dtype, arch, caplog):
    """One module running each ``(op, shapes, params)`` on its own inputs; every kernel's nvcc report."""
    args, emitted = [], []
    for n, (op, shapes, params) in enumerate(calls):
        mine = {name: relax.Var(f"{name}{n}", relax.TensorType(shape, dtype)) for name, shape in shapes.items()}
        args += mine.values()
        emitted.append((op, mine, params))
    mod = build_module(args, lambda bb: relax.Tuple([bb.emit(call_op(bb, op, ins, params))
                                                     for op, ins, params in emitted]))
    with caplog.at_level(logging.INFO, logger="tvm_fusion_ext"):
        compiled = compile_model(mod, resolve_target(f"cuda:{arch}"), fuse_graph=False)
    declined = [r.getMessage() for r in caplog.records if " declines " in r.getMessage()]
    assert not declined, declined
    rows = [row for src in cuda_sources(compiled.executable) for row in kernel_report(src, arch)]
    assert rows and all(r["spill_bytes"] == 0 and r["stack_bytes"] == 0 for r in rows), rows
    return {r["name"]: r for r in rows}


def _attention(b, s, causal, heads=4, kv_heads=4, rope=False):
    shapes = {"q": [b, s, heads, 64], "k": [b, s, kv_heads, 64], "v": [b, s, kv_heads, 64]}
    params = {"scale": 0.125, "causal": causal}
    if rope:
        shapes.update({n: [1, s, 64] for n in ("q_cos", "q_sin", "k_cos", "k_sin")})
        params.update(q_rope="half", k_rope="half")
    else:
        shapes["mask"] = [b, 1, 1, s]
    return "fused_attention", shapes, params


def _dense(b, s):
    return "fused_dense", {"x": [b, s, 384], "w": [384, 1536], "bias": [1536]}, {"act": "gelu"}


def _kernels(rows, prefix):
    return [r for name, r in rows.items() if name.startswith(prefix)]


def _flash(rows):
    """The attention kernels with shared memory, the flash loop's and the one-row branch's split kernel apart."""
    staged = [r for r in _kernels(rows, "fused_attention") if r["smem_bytes"] > 0]
    decode = [r for r in staged if r["decode"]]
    assert len(decode) == 1, staged  # symbolic rows: the decode branch's split kernel (then its combine)
    return [r for r in staged if not r["decode"]]


def test_fp32_kernels_with_symbolic_rows(caplog):
    b, s = _dims()
    norm = {"x": [b, s, 384], "residual": [b, s, 384], "gamma": [384]}
    rows = _compile([_dense(b, s), ("fused_layernorm", {**norm, "beta": [384]}, {"eps": 1e-12}),
                     ("fused_rmsnorm", norm, {"eps": 1e-6}), _attention(b, s, causal=False)], "float32", "sm_90",
                    caplog)
    (dense,) = _kernels(rows, "fused_dense")
    assert dense["smem_bytes"] > 0  # operand tiles staged in shared memory, rows on blockIdx.y
    norms = _kernels(rows, "fused_layernorm") + _kernels(rows, "fused_rmsnorm")
    assert len(norms) == 2 and all(r["smem_bytes"] > 0 for r in norms)  # the row staged, one block per row
    assert len(_flash(rows)) == 1  # the flash loop


def test_fp16_kernels_with_symbolic_rows(caplog):
    b, s = _dims()
    rows = _compile([_dense(b, s), _attention(b, s, causal=True)], "float16", "sm_80", caplog)
    assert all(r["smem_bytes"] > 0 for r in _kernels(rows, "fused_dense"))
    flash = _flash(rows)
    assert len(flash) == 1 and flash[0]["threads_per_block"] % 32 == 0


def test_grouped_rotary_causal_attention_with_symbolic_lengths(caplog):
    b, s = _dims()
    rows = _compile([_attention(b, s, causal=True, heads=8, kv_heads=2, rope=True)], "float32", "sm_90", caplog)
    assert len(_flash(rows)) == 1


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_latent_attention_with_its_own_value_head_dim(caplog, dtype):
    # multi-head latent attention's shape: q/k heads of 192 (128 + 64 rotary), v heads of 128, symbolic lengths
    b, s = _dims()
    shapes = {"q": [b, s, 4, 192], "k": [b, s, 4, 192], "v": [b, s, 4, 128]}
    rows = _compile([("fused_attention", shapes, {"scale": 192 ** -0.5, "causal": True})], dtype, "sm_90", caplog)
    assert len(_flash(rows)) == 1
