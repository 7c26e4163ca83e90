"""Symbolic CPU attention branches to 8-, 32- and 64-key-block variants for short requests (compile/variants/short_keys.py):
every branch against numpy at the lengths on both sides of each boundary, and the kernels it must leave alone."""

import warnings

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from tvm_fusion_ext.compile.variants import short_keys
from tvm_fusion_ext.compile.pipeline import compile_model, prepare
from tvm_fusion_ext.compile.schedule import ApplyTemplates, schedule
from tvm_fusion_ext.ops import call_op
from tvm_fusion_ext.ops.attention import SYMBOLIC_KEY_BLOCK
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.testing import (attention_reference, build_module, kernel_named, key_padding_inputs,
                                    masked_attention_module)

TARGET = resolve_target("llvm")
H, D = 2, 16


def _module(params, seq=None):
    return masked_attention_module(params, H, D, seq=seq)


def _kernel(mod):
    return kernel_named(mod, "fused_attention")


@pytest.mark.slow  # ~60 s per case on 2 cores: once, in the slow tier
@pytest.mark.parametrize("causal", [False, True])
def test_every_branch_matches_numpy_on_both_sides_of_its_boundary(causal):
    params = {"scale": 0.25, "causal": causal}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a template failure on a variant must not surface as a warning
        compiled = compile_model(_module(params), TARGET, fuse_graph=False)
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    for batch, seq in ((1, 1), (3, 1), (2, 5), (1, 8), (2, 9), (2, 31), (1, 32), (2, 33), (1, 64), (1, 65),
                       (2, 130)):
        arrays = key_padding_inputs(batch, seq, H, D, seed=seq)
        got = vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()
        want = attention_reference(*arrays, 0.25, causal)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=f"(batch, seq) = ({batch}, {seq})")


def test_the_kernel_branches_on_its_key_count():
    lowered = prepare(_module({"scale": 0.25}), TARGET, fuse_graph=False)[0]
    kernel = _kernel(schedule(lowered, TARGET))
    assert str(kernel.attrs["tfx.short_key_blocks"]) == "8,32,64"
    assert '"key_block"' not in str(kernel.attrs["tfx.params"])  # the kernel itself keeps the symbolic default
    script = kernel.script()
    for keys in (8, 32, 64):
        assert f"if seq <= T.int64({keys}):" in script
    # seven copies of the flash loop: the 128-key kernel in 1- (a decode step), 16-, 32- and 64-row query tiles
    # (compile/variants/query_tiles.py) and the three short-key variants
    assert script.count('T.sblock("attn_online_update")') == 7


def test_the_shortest_variant_pads_queries_to_one_row_not_sixteen():
    lowered = prepare(_module({"scale": 0.25}), TARGET, fuse_graph=False)[0]
    kernel = _kernel(lowered)
    assert short_keys._variant_params(kernel, 8)["query_block"] == 1
    assert short_keys._variant_params(kernel, 32)["query_block"] == kernel_query_block(kernel)


def _cross_module(queries):
    """Queries static (``queries`` of them), keys symbolic: a cross-attention over a run-time-length memory."""
    batch, seq = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    args = [relax.Var("q", relax.TensorType([batch, queries, H, D], "float32"))]
    args += [relax.Var(n, relax.TensorType([batch, seq, H, D], "float32")) for n in ("k", "v")]
    args.append(relax.Var("mask", relax.TensorType([batch, 1, 1, seq], "float32")))
    return build_module(args, lambda bb: call_op(bb, "fused_attention", dict(zip(("q", "k", "v", "mask"), args)),
                                                 {"scale": 0.25}))


def test_static_queries_keep_their_tile_in_every_variant_and_match_numpy():
    lowered = prepare(_cross_module(12), TARGET, fuse_graph=False)[0]
    assert short_keys._refusal(_kernel(lowered)) is None  # the keys are symbolic: a candidate
    params = short_keys._variant_params(_kernel(lowered), 8)
    assert params.get("query_block") == kernel_query_block(_kernel(lowered))
    compiled = compile_model(_cross_module(12), TARGET, fuse_graph=False)
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    for batch, seq in ((1, 1), (2, 8), (1, 9), (2, 40)):
        q = np.random.default_rng(seq).standard_normal((batch, 12, H, D)).astype("float32")
        _, k, v, mask = key_padding_inputs(batch, seq, H, D, seed=seq)
        got = vm["main"](*[tvm.runtime.tensor(a) for a in (q, k, v, mask)]).numpy()
        np.testing.assert_allclose(got, attention_reference(q, k, v, mask, 0.25, False), rtol=2e-5, atol=2e-5,
                                   err_msg=f"(batch, keys) = ({batch}, {seq})")


def kernel_query_block(kernel):
    import json

    return json.loads(str(kernel.attrs["tfx.params"])).get("query_block")


def test_static_keys_and_cuda_are_left_alone():
    static = _kernel(schedule(prepare(_module({"scale": 0.25}, seq=48), TARGET, fuse_graph=False)[0], TARGET))
    assert "tfx.short_key_blocks" not in static.attrs  # a static kernel has its key block for its length
    cuda = resolve_target("cuda:sm_80")
    kernel = _kernel(schedule(prepare(_module({"scale": 0.25}), cuda, fuse_graph=False)[0], cuda))
    assert "tfx.short_key_blocks" not in kernel.attrs  # CUDA's symbolic path has 32-key blocks already


def test_a_kernel_already_in_short_blocks_is_not_given_variants():
    lowered = prepare(_module({"scale": 0.25, "key_block": 64}), TARGET, fuse_graph=False)[0]
    assert short_keys._refusal(_kernel(lowered)) == "key block 64 is already short"
    assert "tfx.short_key_blocks" not in _kernel(schedule(lowered, TARGET)).attrs


def test_a_variant_the_template_cannot_schedule_drops_the_branch_not_the_build(monkeypatch, caplog):
    lowered = prepare(_module({"scale": 0.25}), TARGET, fuse_graph=False)[0]
    plain = _kernel(ApplyTemplates(TARGET)(lowered))  # scheduled, before the dispatch
    assert short_keys._refusal(plain) is None

    def unscheduled(mod):  # as if no template took the variant
        return mod

    caplog.set_level("INFO", logger="tvm_fusion_ext.compile.variants.short_keys")
    assert short_keys.dispatch(plain, unscheduled) is None
    assert "8-key variant was not scheduled by a template" in caplog.text

    def failing(mod):
        raise RuntimeError("boom")

    assert short_keys.dispatch(plain, failing) is None
    assert "failed: boom" in caplog.text


def test_symbolic_key_block_is_above_every_variant():
    assert max(short_keys.SHORT_KEY_BLOCKS) < SYMBOLIC_KEY_BLOCK


def test_a_variant_takes_the_knobs_of_records_tuned_at_its_key_block():
    """Records tuned at 64 keys (the static kernel's key block for 33–64 keys) reach the 64-key variant; the
    128-key kernel and the 8- and 32-key variants have other signatures and keep their defaults."""
    from tvm_fusion_ext.schedules.kernel_knobs import KernelKnobs, TransferredKnobs, kernel_signature

    static64 = _kernel(prepare(_module({"scale": 0.25}, seq=64), TARGET, fuse_graph=False)[0])
    table = KernelKnobs()
    table.add(TransferredKnobs("tfx.attention", kernel_signature(static64),
                               {"qk_rows": 1, "pv_rows": 0, "unroll": 2}, "by hand"))
    lowered = prepare(_module({"scale": 0.25}), TARGET, fuse_graph=False, kernel_knobs=table)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scheduled = schedule(lowered, TARGET, kernel_knobs=table)
    assert table.scheduled == {kernel_signature(static64): 1}
    assert str(_kernel(scheduled).attrs["tfx.short_key_blocks"]) == "8,32,64"
