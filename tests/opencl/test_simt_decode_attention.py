"""The CUDA template of the split-K decode attention (schedules/cuda/decode_attention.py) run on PoCL through the
OpenCL stand-in, against numpy: one query row per head against P cached keys plus the new one (P = 0, 1, 7, 129,
1000), MHA / GQA 4 / MQA, head dims 64 and 128, fp32 and fp16, a padded and a left-padded past from the mask,
and one kernel built for a symbolic key count run at several lengths (its split count follows the keys)."""

import numpy as np
import pytest
from tvm import relax, tirx

from tvm_fusion_ext.ops.registry import make_prim_func
from tvm_fusion_ext.schedules.cuda.decode_attention import CUDA_DECODE_KEY_BLOCK, CUDA_DECODE_SPLIT_BLOCKS
from tvm_fusion_ext.testing import decode_attention_reference as reference
from tvm_fusion_ext.testing import past_mask
from tvm_fusion_ext.tools.simt_on_cpu import OpenCLFunction, schedule_prim

TOL = {"float32": 2e-5, "float16": 2e-3}
PARAMS = {"key_block": CUDA_DECODE_KEY_BLOCK, "split_blocks": CUDA_DECODE_SPLIT_BLOCKS}


def _kernel(target, types, params):
    func = make_prim_func("fused_attention", types, dict(PARAMS, **params))
    return OpenCLFunction(schedule_prim(func, "tfx.decode_attention", target), target)


def _arrays(B, H, HKV, P, D, dtype, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, 1, H, D)).astype(dtype)
    k, v = (rng.standard_normal((B, P + 1, HKV, D)).astype(dtype) for _ in range(2))
    return q, k, v


def _check(fn, q, k, v, mask, scale, dtype, what):
    out = np.zeros(q.shape, dtype)
    fn(*[a for a in (q, k, v, mask) if a is not None], out)
    got = out.astype("float32")
    assert np.isfinite(got).all(), what
    want = reference(q, k, v, mask, scale)  # float64 of the values the kernel read
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype], err_msg=what)
    return fn


def _types(**arrays):
    return {n: relax.TensorType(list(a.shape), str(a.dtype)) for n, a in arrays.items() if a is not None}


@pytest.mark.parametrize("B,H,HKV,P,D,dtype", [
    (2, 4, 4, 0, 64, "float32"),       # no past: the new key alone, one split of one block
    (1, 16, 4, 1, 128, "float32"),     # GQA 4
    (2, 8, 1, 7, 128, "float16"),      # MQA: eight query heads on one K/V head
    (1, 16, 4, 129, 64, "float16"),    # 130 keys: two splits, the last one key long
    (1, 32, 8, 1000, 128, "float32"),  # LLaMA-7B-like heads: eight splits
    pytest.param(1, 32, 1, 1000, 64, "float16", marks=pytest.mark.slow),  # MQA, a whole warp-row per head
])
def test_against_numpy(simt, B, H, HKV, P, D, dtype):
    q, k, v = _arrays(B, H, HKV, P, D, dtype, seed=P + H)
    scale = float(D ** -0.5)
    fn = _kernel(simt, _types(q=q, k=k, v=v), {"scale": scale})
    _check(fn, q, k, v, None, scale, dtype, f"P {P}")
    # the grid: (batch, K/V head, split) blocks, then the combine
    keys_per_split = CUDA_DECODE_KEY_BLOCK * CUDA_DECODE_SPLIT_BLOCKS
    assert len(fn.launches) == 2, fn.launches
    assert fn.launches[0]["grid"][0] == B * HKV * -(-(P + 1) // keys_per_split), fn.launches[0]


@pytest.mark.parametrize("left", [False, True])
def test_padded_and_left_padded_pasts_from_the_mask(simt, left):
    B, H, HKV, P, D = 3, 8, 2, 150, 64
    mask = past_mask(B, P, pad=(0, 37, 150), left=left)  # the last sequence has no past at all
    q, k, v = _arrays(B, H, HKV, P, D, "float32", seed=5)
    fn = _kernel(simt, _types(q=q, k=k, v=v, mask=mask), {"scale": 0.125, "causal": True})
    _check(fn, q, k, v, mask, 0.125, "float32", f"left {left}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_one_kernel_for_a_symbolic_key_count(simt, dtype):
    """Built once for keys known only at run time (a growing cache), with a padded past from the mask: each
    length runs its own number of splits."""
    B, H, HKV, D = 2, 8, 2, 64
    T = tirx.Var("keys", "int64")
    types = {"q": relax.TensorType([B, 1, H, D], dtype), "k": relax.TensorType([B, T, HKV, D], dtype),
             "v": relax.TensorType([B, T, HKV, D], dtype), "mask": relax.TensorType([B, 1, 1, T], dtype)}
    fn = _kernel(simt, types, {"scale": 0.125, "causal": True})
    grids = []
    for P in (0, 1, 7, 129, 1000):
        q, k, v = _arrays(B, H, HKV, P, D, dtype, seed=P)
        mask = past_mask(B, P, pad=(0, P // 3), left=False).astype(dtype)
        _check(fn, q, k, v, mask, 0.125, dtype, f"P {P}")
        grids.append(fn.launches[0]["grid"][0])
    assert grids == [B * HKV * n for n in (1, 1, 1, 2, 8)], grids


def test_target_resources_of_the_template(simt):
    """Head dim 128 in fp32, a group of 32 query heads (MQA): the K and V tiles and the block's threads stay within
    a CUDA block's limits (48 KiB of shared memory, 1024 threads)."""
    import re

    q, k, v = _arrays(1, 32, 1, 40, 128, "float32", seed=1)
    fn = _check(_kernel(simt, _types(q=q, k=k, v=v), {"scale": 0.1}), q, k, v, None, 0.1, "float32", "MQA 32")
    shared = sum(int(n) * 4 for n in re.findall(r"__local float \w+\[(\d+)\]", fn.source))
    assert shared <= 48 * 1024, shared
    threads = [int(np.prod(launch["block"])) for launch in fn.launches]
    assert max(threads) <= 1024, fn.launches
