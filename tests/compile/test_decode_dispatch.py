"""One-row (decode) requests of symbolic CPU attention run the split-K decode kernel (compile/variants/decode.py):
the decode kernel over a symbolic cache length built once and run at several lengths (P + 1 = 1 included), the
branch in front of the kernel's others, the static one-row form, the kernels left alone, and CUDA's branch."""

import warnings

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, tirx

from tvm_fusion_ext.compile.pipeline import compile_model, prepare
from tvm_fusion_ext.compile.schedule import schedule
from tvm_fusion_ext.compile.variants import decode
from tvm_fusion_ext.ops import call_op
from tvm_fusion_ext.ops.decode_attention import DECODE_KEY_BLOCK, DEFAULT_SPLIT_BLOCKS
from tvm_fusion_ext.ops.registry import make_prim_func, params_of
from tvm_fusion_ext.schedules.cpu.decode_attention import decode_attention_cpu
from tvm_fusion_ext.targets import resolve_target
from tvm_fusion_ext.testing import build_module, kernel_named, past_mask
from tvm_fusion_ext.testing import decode_attention_reference as reference

TARGET = resolve_target({"kind": "llvm", "num-cores": 2})
H, HKV, D = 8, 2, 64


def _module(params, rows=None, keys=None):
    """``main(q, k, v, mask)``: one GQA ``fused_attention``, batch, query rows and keys symbolic unless given."""
    batch = tirx.Var("batch", "int64")
    rows = rows if rows is not None else tirx.Var("seq", "int64")
    keys = keys if keys is not None else tirx.Var("keys", "int64")
    args = [relax.Var("q", relax.TensorType([batch, rows, H, D], "float32"))]
    args += [relax.Var(n, relax.TensorType([batch, keys, HKV, D], "float32")) for n in "kv"]
    args.append(relax.Var("mask", relax.TensorType([batch, 1, rows, keys], "float32")))
    return build_module(args, lambda bb: call_op(bb, "fused_attention", dict(zip("qkv", args[:3]), mask=args[3]),
                                                 params))


def _kernel(mod):
    return kernel_named(mod, "fused_attention")


def _inputs(batch, rows, past, seed, pad=None, left=True):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, rows, H, D)).astype("float32")
    k, v = (rng.standard_normal((batch, past + rows, HKV, D)).astype("float32") for _ in range(2))
    if rows == 1:
        mask = past_mask(batch, past, pad or (0,) * batch, left)
    else:  # causal over the new rows, the whole past visible
        i, j = np.arange(rows)[:, None], np.arange(past + rows)[None, :]
        mask = np.broadcast_to(np.where(j <= i + past, 0.0, -np.inf), (batch, 1, rows, past + rows))
    return q, k, v, np.ascontiguousarray(mask, dtype="float32")


def _reference(q, k, v, mask, scale):
    if q.shape[1] == 1:
        return reference(q, k, v, mask, scale)
    group = H // HKV
    kk, vv = (np.repeat(x.astype("float64"), group, axis=2) for x in (k, v))
    s = np.einsum("bshd,bthd->bhst", q.astype("float64"), kk) * scale + mask
    w = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhst,bthd->bshd", w / w.sum(-1, keepdims=True), vv)


def test_symbolic_cache_length_built_once_runs_at_every_length():
    """The decode kernel over symbolic batch and keys, one build: P = 0, 1, 7, 129, 1000, padded and left-padded."""
    batch, keys = tirx.Var("batch", "int64"), tirx.Var("keys", "int64")
    types = {"q": relax.TensorType([batch, 1, H, D], "float32"),
             "k": relax.TensorType([batch, keys, HKV, D], "float32"),
             "v": relax.TensorType([batch, keys, HKV, D], "float32"),
             "mask": relax.TensorType([batch, 1, 1, keys], "float32")}
    params = {"scale": 0.125, "causal": True, "key_block": 64, "split_blocks": 2}
    func = make_prim_func("fused_attention", types, params).with_attr("global_symbol", "main")
    sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
    decode_attention_cpu(sch, sch.get_sblock("dec_out"), TARGET)
    lib = tvm.compile(sch.mod, target=TARGET)
    for batch_size, past, pad, left in ((1, 0, (0,), True), (2, 1, (0, 1), False), (3, 7, (0, 3, 7), True),
                                        (2, 129, (0, 100), False), (1, 1000, (0,), True), (2, 1000, (999, 5), True)):
        q, k, v, mask = _inputs(batch_size, 1, past, seed=past, pad=pad, left=left)
        out = tvm.runtime.empty(q.shape, "float32", tvm.cpu())
        lib(*[tvm.runtime.tensor(a) for a in (q, k, v, mask)], out)
        np.testing.assert_allclose(out.numpy(), reference(q, k, v, mask, 0.125), rtol=2e-5, atol=2e-5,
                                   err_msg=f"batch {batch_size}, past {past}")


def test_a_cache_of_past_plus_new_keys_gets_the_branch():
    """Keys ``past + seq`` (a decoder's cache with the new token): the kernel takes ``past`` as a scalar parameter,
    which the decode variant reads as its own."""
    rows, past = tirx.Var("seq", "int64"), tirx.Var("past", "int64")
    kernel = _kernel(schedule(prepare(_module({"scale": 0.125}, rows=rows, keys=past + rows), TARGET,
                                      fuse_graph=False)[0], TARGET))
    assert len(kernel.params) == 6  # q, k, v, mask, past, out
    assert str(kernel.attrs[decode.DECODE_ATTR]) == "1"


def test_one_row_requests_branch_to_the_decode_kernel_before_every_other_branch():
    kernel = _kernel(schedule(prepare(_module({"scale": 0.125}), TARGET, fuse_graph=False)[0], TARGET))
    assert str(kernel.attrs[decode.DECODE_ATTR]) == "1"
    script = kernel.script()
    first_branch = script.index("if ")
    assert script[first_branch:].startswith("if seq == T.int64(1)"), script[first_branch:first_branch + 80]
    assert "dec_split" in script and "attn_online" in script


def test_static_one_row_attention_takes_the_decode_form():
    one_row = _kernel(prepare(_module({"scale": 0.125}, rows=1), TARGET, fuse_graph=False)[0])
    assert params_of(one_row)["split_blocks"] == DEFAULT_SPLIT_BLOCKS
    assert params_of(one_row)["key_block"] == DECODE_KEY_BLOCK  # symbolic keys
    static_keys = _kernel(prepare(_module({"scale": 0.125}, rows=1, keys=20), TARGET, fuse_graph=False)[0])
    assert params_of(static_keys)["key_block"] == 32  # a short static cache: a block that covers it
    two_rows = _kernel(prepare(_module({"scale": 0.125}, rows=2), TARGET, fuse_graph=False)[0])
    assert "split_blocks" not in params_of(two_rows)


def test_static_rows_are_left_alone_and_cuda_gets_the_branch_with_its_own_tiles():
    """CUDA: the same branch, the decode form with the CUDA template's key block and splits (numerics on PoCL:
    tests/opencl/test_simt_decode_dispatch.py; nvcc: tests/cuda/test_cuda_decode_attention.py)."""
    from tvm_fusion_ext.schedules.cuda.decode_attention import CUDA_DECODE_KEY_BLOCK, CUDA_DECODE_SPLIT_BLOCKS

    static = _kernel(prepare(_module({"scale": 0.125}, rows=4), TARGET, fuse_graph=False)[0])
    assert decode._refusal(static) == ""
    cuda = resolve_target("cuda:sm_80")
    kernel = _kernel(schedule(prepare(_module({"scale": 0.125}), cuda, fuse_graph=False)[0], cuda))
    assert kernel.attrs[decode.DECODE_ATTR] == "1"
    assert "blockIdx.x" in kernel.script() and "dec_split" in kernel.script()
    one_row = params_of(_kernel(prepare(_module({"scale": 0.125}, rows=1), cuda, fuse_graph=False)[0]))
    assert (one_row["split_blocks"], one_row["key_block"]) == (CUDA_DECODE_SPLIT_BLOCKS, CUDA_DECODE_KEY_BLOCK)


def test_packed_attention_is_refused_with_its_reason():
    rows = tirx.Var("rows", "int64")
    n = tirx.Var("n", "int64")
    types = {"q": relax.TensorType([1, rows, H, D], "float32"), "k": relax.TensorType([1, rows, HKV, D], "float32"),
             "v": relax.TensorType([1, rows, HKV, D], "float32"), "cu_seqlens": relax.TensorType([n + 1], "int32"),
             "row_seq": relax.TensorType([rows], "int32"), "key_bias": relax.TensorType([n, 64], "float32")}
    packed = make_prim_func("fused_attention", types, {"scale": 0.125})
    assert decode._refusal(packed) == "packed attention: its rows are many sequences' tokens"


@pytest.mark.slow  # a symbolic build with every run-time branch: ~40 s on 2 cores
def test_every_request_matches_numpy_through_the_build():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a template failure on the decode variant must not surface as a warning
        compiled = compile_model(_module({"scale": 0.125, "causal": True}), TARGET, fuse_graph=False)
    vm = relax.VirtualMachine(compiled.executable, tvm.cpu())
    for batch, rows, past in ((1, 1, 0), (2, 1, 1), (3, 1, 7), (2, 1, 129), (1, 1, 1000), (2, 3, 9), (1, 17, 40)):
        arrays = _inputs(batch, rows, past, seed=past + rows, pad=(0,) * (batch - 1) + (past // 2,))
        got = vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()
        np.testing.assert_allclose(got, _reference(*arrays, 0.125), rtol=2e-5, atol=2e-5,
                                   err_msg=f"(batch, rows, past) = {(batch, rows, past)}")


def test_cuda_declines_a_group_wider_than_a_thread_block():
    """64 query heads on one K/V head (64 warps): the CUDA decode template declines, and a static one-row CUDA
    attention keeps the flash-loop form."""
    from tvm_fusion_ext.schedules.cuda.decode_attention import cuda_decode_params
    from tvm_fusion_ext.schedules.registry import get_template

    cuda = resolve_target("cuda:sm_80")
    types = {"q": relax.TensorType([1, 1, 64, 64], "float32"), "k": relax.TensorType([1, 40, 1, 64], "float32"),
             "v": relax.TensorType([1, 40, 1, 64], "float32")}
    wide = make_prim_func("fused_attention", types, cuda_decode_params({"scale": 0.125}, 40))
    template = get_template("tfx.decode_attention", cuda)
    sch = s_tir.Schedule(tvm.IRModule({"main": wide}))
    assert "do not fit one thread block" in template.decline(sch, sch.get_sblock("dec_out"), cuda)
    narrow = make_prim_func("fused_attention", dict(types, q=relax.TensorType([1, 1, 32, 64], "float32")),
                            cuda_decode_params({"scale": 0.125}, 40))
    sch = s_tir.Schedule(tvm.IRModule({"main": narrow}))
    assert template.decline(sch, sch.get_sblock("dec_out"), cuda) is None
    args = [relax.Var(n, t) for n, t in types.items()]
    mod = build_module(args, lambda bb: call_op(bb, "fused_attention", dict(zip("qkv", args)), {"scale": 0.125}))
    assert "split_blocks" not in params_of(_kernel(prepare(mod, cuda, fuse_graph=False)[0]))
