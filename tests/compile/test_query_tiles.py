"""Symbolic CPU attention picks 64-, 32- or 16-row query tiles at run time (compile/variants/query_tiles.py): the choice
at the lengths that decide it, every branch against numpy, and the kernels it must leave alone."""

import warnings

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from tvm_fusion_ext.compile.variants import query_tiles
from tvm_fusion_ext.compile.pipeline import compile_model, prepare
from tvm_fusion_ext.compile.schedule import schedule
from tvm_fusion_ext.ops import call_op
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.testing import (attention_reference, build_module, kernel_named, key_padding_inputs,
                                    masked_attention_module)

TARGET = resolve_target({"kind": "llvm", "num-cores": 2})
H, D = 4, 16


def _module(params, seq=None, batch=None):
    return masked_attention_module(params, H, D, seq=seq, batch=batch)


def _kernel(mod):
    return kernel_named(mod, "fused_attention")


def _lowered(params, **dims):
    return _kernel(prepare(_module(params, **dims), TARGET, fuse_graph=False)[0])


def _chosen(kernel, batch, seq, cores=2):
    """The tile the kernel's branches pick for (batch, seq): 64, 32, or 16 (the kernel as built)."""
    return query_tiles.tile_for(kernel, cores, batch, seq)


def test_the_tile_that_pads_least_for_its_cost_is_chosen():
    kernel = _lowered({"scale": 0.25})
    # no padding at 64 rows: the large tile; 96 rows: 32 (64 would pad to 128); 80, 100, 200: the 16-row kernel
    assert {seq: _chosen(kernel, 2, seq) for seq in (65, 80, 96, 100, 120, 128, 200, 256, 384)} == \
        {65: 16, 80: 16, 96: 32, 100: 16, 120: 64, 128: 64, 200: 16, 256: 64, 384: 64}
    # every core keeps MIN_TASKS_PER_CORE tasks: one 4-head request of 128 rows is 8 tiles of 64 rows, enough
    # for 2 cores; for 4 the next best tile (32 rows, 16 tasks); for 16 neither (the kernel keeps its 32 tasks)
    assert _chosen(kernel, 1, 128, cores=2) == 64
    assert _chosen(kernel, 1, 128, cores=4) == 32
    assert _chosen(kernel, 1, 128, cores=16) == 16
    assert _chosen(kernel, 8, 128, cores=16) == 64
    # one query row per sequence (a decode step): a 1-row tile, whatever the batch and the cores
    assert {_chosen(kernel, b, 1, cores=c) for b in (1, 4, 64) for c in (2, 16)} == {query_tiles.DECODE_TILE} == {1}


@pytest.mark.slow  # ~70 s per case on 2 cores: once, in the slow tier
@pytest.mark.parametrize("causal", [False, True])
def test_every_tile_matches_numpy(causal):
    params = {"scale": 0.25, "causal": causal}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a template failure on a variant must not surface as a warning
        compiled = compile_model(_module(params), TARGET, fuse_graph=False)
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    kernel = _lowered(params)
    cases = ((2, 128), (2, 96), (1, 100), (2, 120), (1, 192))
    assert {_chosen(kernel, b, s) for b, s in cases} == {64, 32, 16}  # each branch runs at least once
    for batch, seq in cases:
        arrays = key_padding_inputs(batch, seq, H, D, seed=seq)
        got = vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()
        want = attention_reference(*arrays, 0.25, causal)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=f"(batch, seq) = ({batch}, {seq})")


def test_the_kernel_branches_inside_its_long_request_path():
    kernel = _kernel(schedule(prepare(_module({"scale": 0.25}), TARGET, fuse_graph=False)[0], TARGET))
    assert str(kernel.attrs["tfx.query_tiles"]) == "1,64,32"
    assert str(kernel.attrs["tfx.short_key_blocks"]) == "8,32,64"  # the short-key branches come first
    script = kernel.script()
    assert script.index("if seq <= T.int64(64):") < script.index("seq + T.int64(63)) // T.int64(64)")


def test_static_rows_a_chosen_tile_packed_attention_and_cuda_are_left_alone():
    static = _kernel(schedule(prepare(_module({"scale": 0.25}, seq=128), TARGET, fuse_graph=False)[0], TARGET))
    assert "tfx.query_tiles" not in static.attrs  # static rows have the tile made for their count
    assert query_tiles._refusal(_lowered({"scale": 0.25, "query_block": 32})) == "query tile 32 was chosen for it"
    cuda = resolve_target("cuda:sm_80")
    kernel = _kernel(schedule(prepare(_module({"scale": 0.25}), cuda, fuse_graph=False)[0], cuda))
    assert "tfx.query_tiles" not in kernel.attrs


def test_packed_attention_is_refused_with_its_reason():
    total = tirx.Var("total", "int64")
    q, k, v = (relax.Var(n, relax.TensorType([1, total, H, D], "float32")) for n in "qkv")
    cu = relax.Var("cu_seqlens", relax.TensorType([3], "int32"))
    row_seq = relax.Var("row_seq", relax.TensorType([total], "int32"))
    key_bias = relax.Var("key_bias", relax.TensorType([2, 64], "float32"))
    args = [q, k, v, cu, row_seq, key_bias]
    mod = build_module(args, lambda bb: call_op(bb, "fused_attention", dict(zip(
        ("q", "k", "v", "cu_seqlens", "row_seq", "key_bias"), args)), {"scale": 0.25}))
    kernel = _kernel(prepare(mod, TARGET, fuse_graph=False)[0])
    assert query_tiles._refusal(kernel) == "packed attention: its tiles follow its sequences"
