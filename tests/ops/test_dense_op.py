"""fused_dense on CPU: compute + template, against numpy over odd sizes, layouts, activations and knobs."""

import math

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir

from tvm_fusion_ext.ops.dense import ACTIVATIONS, pack_weight
from tvm_fusion_ext.ops.registry import make_prim_func
from tvm_fusion_ext.schedules.cpu.dense import DenseCPU, dense_cpu, pack_nr
from tvm_fusion_ext.schedules.registry import get_template
from tvm_fusion_ext.testing import numpy_activation

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})
def _run_dense(x_shape, K, N, act="none", bias=True, transpose_b=False, packed=False, knobs=None, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*x_shape, K)).astype("float32")
    w = (rng.standard_normal((N, K) if transpose_b else (K, N)) / math.sqrt(K)).astype("float32")
    b = rng.standard_normal(N).astype("float32")
    ty = lambda a: relax.TensorType(list(a.shape), "float32")  # noqa: E731
    params = {"act": act, "transpose_b": transpose_b}
    w_arg = w
    if packed:
        w_arg = pack_weight(w, pack_nr(N), transpose_b)
        params = {"act": act, "w_layout": "packed", "out_features": N}
    inputs = {"x": x, "w": w_arg, **({"bias": b} if bias else {})}
    func = make_prim_func("fused_dense", {k: ty(v) for k, v in inputs.items()}, params)
    sch = s_tir.Schedule(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), seed=1)
    dense_cpu(sch, sch.get_sblock("dense"), TARGET, knobs)
    lib = tvm.compile(sch.mod, target=TARGET)
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros((*x_shape, N), "float32"), dev)
    lib(*[tvm.runtime.tensor(v, dev) for v in inputs.values()], out)
    z = x.astype("float64") @ (w.T if transpose_b else w).astype("float64") + (b if bias else 0)
    return out.numpy(), numpy_activation(z, act), sch.mod["main"].script()


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("bias", [True, False])
def test_activations(act, bias):
    got, want, _ = _run_dense((13,), 37, 40, act=act, bias=bias, packed=True)
    _close(got, want)


@pytest.mark.parametrize("x_shape,K,N", [((1,), 1, 1), ((7,), 13, 100), ((129,), 64, 33), ((100,), 7, 13),
                                          ((2, 3), 24, 48), ((), 16, 24), ((4, 5), 129, 17)])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_odd_shapes_and_layouts(x_shape, K, N, packed, transpose_b):
    got, want, _ = _run_dense(x_shape, K, N, act="gelu", transpose_b=transpose_b, packed=packed)
    _close(got, want)


@pytest.mark.parametrize("packed,knobs", [
    (False, {"i": [2, 16, 4], "j": [3, 32], "k": [4, 16], "unroll": 2}),
    (False, {"i": [1, 128, 1], "j": [12, 8], "k": [1, 64], "unroll": 0}),
    (True, {"i": [4, 4, 8], "k": [2, 32], "unroll": 3}),
])
def test_explicit_knobs(packed, knobs):
    got, want, _ = _run_dense((128,), 64, 96, act="relu", packed=packed, knobs=knobs)
    _close(got, want)


def test_default_schedule_is_parallel_vectorised_and_unrolled():
    _, _, script = _run_dense((64,), 32, 64, act="gelu", packed=True)
    assert "T.parallel(" in script
    assert script.count("T.vectorized(") >= 3  # init, micro-kernel, write-back
    assert "T.unroll(" in script


def test_registered_as_cpu_template():
    assert isinstance(get_template("tfx.dense", TARGET), DenseCPU)


def test_pack_weight_layout():
    w = np.arange(5 * 20, dtype="float32").reshape(5, 20)
    p = pack_weight(w, 8)
    assert p.shape == (3, 5, 8)
    np.testing.assert_array_equal(p[1, :, 2], w[:, 10])
    assert not p[2, :, 4:].any()  # padding past N is zero
    np.testing.assert_array_equal(pack_weight(w.T.copy(), 8, transpose_b=True), p)


def test_rows_blocked_only_when_x_outgrows_the_cache():
    """x re-read by every column panel: blocked into ~1 MiB row blocks once it passes X_RESIDENT_BYTES."""
    from tvm_fusion_ext.schedules.cpu.dense import ROW_BLOCK_BYTES, X_RESIDENT_BYTES, default_ip

    tile = 4 * 768 * 4  # 4 rows of K = 768 fp32
    assert default_ip(128, 96, 2, tile) == 1  # 1.5 MiB of x: panels outer, as before
    ip = default_ip(1992, 192, 2, tile)  # BERT-base FFN at 16 × 498 tokens: 24 MiB of x
    assert 1992 * tile > X_RESIDENT_BYTES and 1992 % ip == 0
    assert 1992 // ip * tile <= ROW_BLOCK_BYTES < 1992 // (ip - 1 or 1) * tile


def test_row_blocked_dense_matches_numpy():
    # 2048 × 1152 fp32 = 9 MiB of x: the row-blocked default schedule
    got, want, _ = _run_dense((2048,), 1152, 32, act="gelu", packed=True)
    _close(got, want)
