"""fused_attention's packed (varlen) form: sequences packed back to back, ``cu_seqlens`` offsets, each query row
attending to its own sequence only. Against numpy attention run sequence by sequence (float64), with lengths 1
and full, an empty sequence, GQA, causal and a key bias; compiled once with symbolic sizes through the CPU
template (a template failure fails the test). Malformed packed calls are refused with one clear line."""

import re
import warnings

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, tirx

from tvm_fusion_ext.compile.pipeline import compile_model
from tvm_fusion_ext.ops import call_op
from tvm_fusion_ext.ops.registry import make_prim_func
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.testing import build_module

TARGET = resolve_target("llvm")
H, D = 4, 32
NAMES = ("q", "k", "v", "cu_seqlens", "row_seq", "key_bias")


def packed_module(params, heads_kv=H, index_dtype="int64"):
    """``fused_attention`` on packed inputs whose token count, sequence count and longest length are symbolic."""
    tokens, nseq, span = (tirx.Var(n, "int64") for n in ("tokens", "nseq", "span"))
    shapes = ([1, tokens, H, D], [1, tokens, heads_kv, D], [1, tokens, heads_kv, D], [nseq + 1], [tokens],
              [nseq, span])
    dtypes = ("float32",) * 3 + (index_dtype, index_dtype, "float32")
    args = [relax.Var(n, relax.TensorType(s, t)) for n, s, t in zip(NAMES, shapes, dtypes)]
    return build_module(args, lambda bb: call_op(bb, "fused_attention", dict(zip(NAMES, args)), params))


def packed_inputs(lengths, span, heads_kv=H, seed=0, index_dtype="int64", head_dim=D):
    rng = np.random.default_rng(seed)
    total = sum(lengths)
    q = rng.standard_normal((1, total, H, head_dim)).astype("float32")
    k, v = (rng.standard_normal((1, total, heads_kv, head_dim)).astype("float32") for _ in range(2))
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(index_dtype)
    row_seq = np.repeat(np.arange(len(lengths)), lengths).astype(index_dtype)
    bias = rng.uniform(-2, 2, (len(lengths), span)).astype("float32")
    return q, k, v, cu, row_seq, bias


def reference(q, k, v, cu, bias, scale, causal):
    """Per sequence: softmax(scale · q kᵀ + bias over its own keys) v, K/V heads repeated repeat_kv's way."""
    out = np.zeros(q.shape, "float64")
    group = q.shape[2] // k.shape[2]
    for n in range(len(cu) - 1):
        lo, hi = int(cu[n]), int(cu[n + 1])
        if hi == lo:
            continue
        qs = q[0, lo:hi].astype("float64").transpose(1, 0, 2)
        ks, vs = (np.repeat(a[0, lo:hi].astype("float64").transpose(1, 0, 2), group, axis=0) for a in (k, v))
        scores = qs @ ks.transpose(0, 2, 1) * scale + bias[n, :hi - lo]
        if causal:
            scores = np.where(np.tril(np.ones((hi - lo, hi - lo), bool)), scores, -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        out[0, lo:hi] = (p / p.sum(-1, keepdims=True) @ vs).transpose(1, 0, 2)
    return out


def _run(executable, arrays):
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


@pytest.mark.parametrize("causal,heads_kv", [(False, H), (True, H), (False, 2), (True, 1)])
def test_packed_attention_matches_per_sequence_attention(causal, heads_kv):
    params = {"scale": 0.2, "causal": causal, "key_block": 16}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a template failure (fallback warning) fails the test
        compiled = compile_model(packed_module(params, heads_kv), TARGET, fuse_graph=False)
    # length 1, full length (= span), an empty sequence, lengths across key-block and query-tile edges
    for lengths, span in (([1, 40, 17, 0, 33], 40), ([40], 40), ([5, 1, 16, 3], 16), ([1], 1)):
        arrays = packed_inputs(lengths, span, heads_kv, seed=sum(lengths))
        got = _run(compiled.executable, arrays)
        want = reference(*arrays[:4], arrays[5], 0.2, causal)
        np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-5)


def test_static_sizes():
    tokens, nseq, span = 24, 3, 16
    shapes = ([1, tokens, H, D],) * 3 + ([nseq + 1], [tokens], [nseq, span])
    dtypes = ("float32",) * 3 + ("int64", "int64", "float32")
    args = [relax.Var(n, relax.TensorType(s, t)) for n, s, t in zip(NAMES, shapes, dtypes)]
    params = {"scale": 0.2, "causal": True}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = compile_model(build_module(args, lambda bb: call_op(bb, "fused_attention", dict(zip(NAMES, args)),
                                                                       params)), TARGET, fuse_graph=False)
    arrays = packed_inputs([16, 1, 7], span)
    np.testing.assert_allclose(_run(compiled.executable, arrays), reference(*arrays[:4], arrays[5], 0.2, True),
                               rtol=3e-5, atol=3e-5)


def test_int32_offsets_and_every_sequence_empty():
    compiled = compile_model(packed_module({"scale": 0.2}, index_dtype="int32"), TARGET, fuse_graph=False)
    arrays = packed_inputs([3, 9, 2], 9, index_dtype="int32")
    np.testing.assert_allclose(_run(compiled.executable, arrays), reference(*arrays[:4], arrays[5], 0.2, False),
                               rtol=3e-5, atol=3e-5)
    empty = packed_inputs([0, 0], 4, index_dtype="int32")  # T = 0: no row, and no K/V row to read
    assert _run(compiled.executable, empty).shape == (1, 0, H, D)


def _types(**overrides):
    t = relax.TensorType
    types = {"q": t([1, 12, H, D], "float32"), "k": t([1, 12, H, D], "float32"), "v": t([1, 12, H, D], "float32"),
             "cu_seqlens": t([3], "int64"), "row_seq": t([12], "int64"), "key_bias": t([2, 8], "float32")}
    types.update(overrides)
    return {k: v for k, v in types.items() if v is not None}


@pytest.mark.parametrize("overrides,message", [
    ({"row_seq": None}, "cu_seqlens, row_seq and key_bias together"),
    ({"mask": relax.TensorType([1, 1, 1, 12], "float32")}, "key_bias instead of a mask"),
    ({n: relax.TensorType([2, 6, H, D], "float32") for n in "qkv"}, "one batch of the same rows"),
    ({"cu_seqlens": relax.TensorType([4], "int64")}, "cu_seqlens [N+1]"),
    ({"row_seq": relax.TensorType([12], "float32")}, "int32 or int64"),
])
def test_malformed_packed_calls_are_refused(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make_prim_func("fused_attention", _types(**overrides), {"scale": 0.2})


@pytest.mark.parametrize("causal", [False, True])
def test_key_block_loop_stops_at_the_tiles_sequences(causal):
    """The flash loop of a query tile runs over the key blocks its sequences span (compile/variants/causal_skip.py), not
    over the longest length's: a data-dependent bound read from row_seq and cu_seqlens."""
    from tvm_fusion_ext.compile.variants.causal_skip import SkipMaskedKeyBlocks
    from tvm_fusion_ext.compile.pipeline import prepare
    from tvm_fusion_ext.compile.schedule import schedule

    scheduled = schedule(prepare(packed_module({"scale": 0.2, "causal": causal, "key_block": 16}), TARGET,
                                 fuse_graph=False)[0], TARGET)
    kernel = next(gv for gv, f in scheduled.functions_items() if isinstance(f, tirx.PrimFunc))
    before = scheduled[kernel]
    after = SkipMaskedKeyBlocks()(scheduled)[kernel]
    assert not tvm_ffi.structural_equal(before, after)
    loops = [line for line in after.script().splitlines() if "for " in line and "cu_seqlens[" in line]
    assert loops, after.script()
