"""Kernel speed at real model sizes: each template's kernel alone, timed by TVM's ``time_evaluator`` (many calls per
figure) against torch's kernel for the same op timed the same way (``torch.cuda.Event`` over a loop): fp16 dense at
BERT-base and LLaMA-7B projection sizes vs cuBLAS (``F.linear``), attention S = 512…8192 at head dim 64 / 128,
causal and not, vs SDPA (flash where torch picks it), LayerNorm / RMSNorm vs torch, the split-K decode attention
(one query row, 32 heads on 8 K/V heads of 128, caches of 512…8192 keys, batch 1 and 8) vs SDPA with one row.
Inputs are made on the device from a seed, so nothing but the libraries is carried; each row also says how far our
output is from torch's.

Build side: :func:`cases` and :func:`build` (the compiler). Run side: :func:`run` (tvm.runtime and torch only).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List

#: (N, K) of BERT-base's and LLaMA-7B's projections (out features, in features)
DENSE_SHAPES = {"bert": [(768, 768), (3072, 768), (768, 3072)], "llama7b": [(4096, 4096), (11008, 4096)]}
DENSE_ROWS = (16, 128, 512, 4096)
ATTENTION = [(S, D, causal) for S in (512, 2048, 8192) for D in (64, 128) for causal in (False, True)]
NORM_ROWS = 8192
#: decode attention (one query row per head, split-K): (cached keys, batch) at LLaMA-7B-like heads, 32 query heads
#: on 8 K/V heads of 128
DECODE = [(P, B) for P in (512, 2048, 8192) for B in (1, 8)]
DECODE_HEADS = (32, 8, 128)
#: per part, the seconds a full run of it is expected to take on an H100/H200 (timing loops + library loads)
EXPECTED_S = {"dense": 90, "attention": 150, "norms": 15, "decode": 20}


def cases(part: str, quick: bool = False) -> List[dict]:
    """The kernels of ``part`` (``dense``, ``attention`` or ``norms``); ``quick``: one small case each (tests)."""
    out = []
    if part == "dense":
        shapes = [("bert", 3072, 768)] if quick else [(m, n, k) for m, nk in DENSE_SHAPES.items() for n, k in nk]
        for model, N, K in shapes:
            for M in ((16,) if quick else DENSE_ROWS):
                out.append({"name": f"dense_f16_{model}_M{M}_N{N}_K{K}", "op": "fused_dense", "rule": "tfx.dense",
                            "inputs": {"x": [[1, M, K], "float16"], "w": [[N, K], "float16"],
                                       "bias": [[N], "float16"]},
                            "params": {"act": "none", "transpose_b": True}, "out": [[1, M, N], "float16"],
                            "flops": 2 * M * N * K, "torch": {"op": "dense"}})
    elif part == "attention":
        for S, D, causal in ([(128, 64, True)] if quick else ATTENTION):
            H = 4096 // D if not quick else 2  # LLaMA-7B's width: 32 heads of 128, 64 of 64
            shape = [1, S, H, D]
            out.append({"name": f"attention_f16_S{S}_D{D}_H{H}{'_causal' if causal else ''}", "op": "fused_attention",
                        "rule": "tfx.attention", "inputs": {n: [shape, "float16"] for n in "qkv"},
                        "params": {"scale": D ** -0.5, "causal": causal}, "out": [shape, "float16"],
                        "flops": 4 * S * S * D * H // (2 if causal else 1), "torch": {"op": "attention",
                                                                                      "causal": causal}})
    elif part == "norms":
        for N in ((384,) if quick else (768, 4096)):
            rows = 64 if quick else NORM_ROWS
            x = [[1, rows, N], "float16"]
            out.append({"name": f"layernorm_f16_{rows}x{N}", "op": "fused_layernorm", "rule": "tfx.layernorm",
                        "inputs": {"x": x, "residual": x, "gamma": [[N], "float16"], "beta": [[N], "float16"]},
                        "params": {"eps": 1e-5}, "out": x, "flops": 8 * rows * N, "torch": {"op": "layernorm"}})
            out.append({"name": f"rmsnorm_f16_{rows}x{N}", "op": "fused_rmsnorm", "rule": "tfx.rmsnorm",
                        "inputs": {"x": x, "residual": x, "gamma": [[N], "float16"]},
                        "params": {"eps": 1e-6}, "out": x, "flops": 5 * rows * N, "torch": {"op": "rmsnorm"}})
    elif part == "decode":
        from tvm_fusion_ext.schedules.cuda.decode_attention import cuda_decode_params

        H, HKV, D = (4, 2, 64) if quick else DECODE_HEADS
        for P, B in ([(128, 1)] if quick else DECODE):
            kv = [[B, P, HKV, D], "float16"]
            out.append({"name": f"decode_attention_f16_P{P}_B{B}_H{H}_KV{HKV}_D{D}", "op": "fused_attention",
                        "rule": "tfx.decode_attention",
                        "inputs": {"q": [[B, 1, H, D], "float16"], "k": kv, "v": kv},
                        "params": cuda_decode_params({"scale": D ** -0.5}, P), "out": [[B, 1, H, D], "float16"],
                        "flops": 4 * B * H * P * D, "bytes": 2 * B * HKV * P * D * 2,
                        "torch": {"op": "decode_attention"}})
    else:
        raise ValueError(f"unknown speed part '{part}' (dense, attention, norms, decode)")
    return out


def build(out_dir: Path, part: str, target, quick: bool = False) -> List[dict]:
    """Each case of ``part`` scheduled by its template for ``target`` and exported to ``out_dir/NAME.so``."""
    import tvm
    from tvm import relax, s_tir

    from tvm_fusion_ext.ops.registry import make_prim_func
    from tvm_fusion_ext.schedules.registry import get_template

    out_dir.mkdir(parents=True, exist_ok=True)
    built = []
    for case in cases(part, quick):
        start = time.time()
        types = {k: relax.TensorType(shape, dtype) for k, (shape, dtype) in case["inputs"].items()}
        func = make_prim_func(case["op"], types, case["params"]).with_attr("global_symbol", "main")
        sch = s_tir.Schedule(tvm.IRModule({"main": func}), seed=1)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        block = next(b for b in blocks if str(sch.get(b).annotations.get("schedule_rule", "")) == case["rule"])
        get_template(case["rule"], target)(sch, block, target)
        with target:
            lib = tvm.compile(sch.mod, target)
        lib.export_library(str(out_dir / f"{case['name']}.so"))
        built.append(dict(case, library=f"{case['name']}.so"))
        print(f"built {part}/{case['name']} ({time.time() - start:.0f} s)", flush=True)
    (out_dir / "cases.json").write_text(json.dumps({"part": part, "cases": built}, indent=1))
    return built


# -- run side -----------------------------------------------------------------------------------------------------
def _torch_peer(torch, spec, tensors, params):
    F = torch.nn.functional
    if spec["op"] == "dense":
        x, w, b = tensors
        return lambda: F.linear(x, w, b)
    if spec["op"] == "attention":
        q, k, v = (t.transpose(1, 2) for t in tensors)  # BSHD views as BHSD, as a model hands them over
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=spec["causal"], scale=params["scale"])
    if spec["op"] == "decode_attention":  # one query row against the cache; grouped K/V heads as SDPA takes them
        q, k, v = (t.transpose(1, 2) for t in tensors)
        group = q.shape[1] // k.shape[1]
        try:
            F.scaled_dot_product_attention(q, k, v, scale=params["scale"], enable_gqa=True)
            return lambda: F.scaled_dot_product_attention(q, k, v, scale=params["scale"], enable_gqa=True)
        except TypeError:  # a torch before 2.5: K/V heads repeated once, outside the timed call
            k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
            return lambda: F.scaled_dot_product_attention(q, k, v, scale=params["scale"])
    if spec["op"] == "layernorm":
        x, r, g, b = tensors
        return lambda: F.layer_norm(x + r, (x.shape[-1],), g, b, params["eps"])
    x, r, g = tensors
    if hasattr(F, "rms_norm"):
        return lambda: F.rms_norm(x + r, (x.shape[-1],), g, params["eps"])
    return lambda: (lambda h: h * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + params["eps"]).to(h.dtype)
                    * g)(x + r)


def _calls(flops: float, device: str) -> int:
    """Calls per timing loop: about 0.2 s of work at a rough rate (so that big kernels do not eat the budget)."""
    rate = 2e13 if device == "cuda" else 2e10
    return max(2, min(50, int(0.2 * rate / max(flops, 1))))


def run(in_dir: Path, tvm_dev, torch_device: str, torch_time) -> List[dict]:
    """One row per case: ours_s, torch_s, ratio, max |ours - torch| (errors recorded, never fatal)."""
    import torch
    import tvm

    index = json.loads((in_dir / "cases.json").read_text())
    rows = []
    for n, case in enumerate(index["cases"]):
        row = {"name": case["name"], "gflop": case["flops"] / 1e9}
        try:
            gen = torch.Generator(device=torch_device).manual_seed(n)
            tensors = [(torch.randn(shape, generator=gen, device=torch_device) /
                        (shape[-1] ** 0.5 if name == "w" else 1)).to(getattr(torch, dtype))
                       for name, (shape, dtype) in case["inputs"].items()]
            out = torch.zeros(case["out"][0], dtype=getattr(torch, case["out"][1]), device=torch_device)
            lib = tvm.runtime.load_module(str(in_dir / case["library"]))
            args = [tvm.runtime.from_dlpack(t) for t in tensors] + [tvm.runtime.from_dlpack(out)]
            number = _calls(case["flops"], torch_device)
            timer = lib.time_evaluator("main", tvm_dev, number=number, repeat=3)
            row["ours_s"] = float(min(timer(*args).results))
            peer = _torch_peer(torch, case["torch"], tensors, case["params"])
            row["torch_s"] = torch_time(torch, peer, number=number)
            row["ours_over_torch"] = row["ours_s"] / row["torch_s"]
            want = peer().float()
            if case["torch"]["op"] in ("attention", "decode_attention"):
                want = want.transpose(1, 2)
            row["max_abs_vs_torch"] = float((out.float() - want).abs().max())
            row["tflops"] = case["flops"] / row["ours_s"] / 1e12
            if "bytes" in case:  # a memory-bound kernel (decode attention: the cache read once)
                row["gbytes_per_s"] = case["bytes"] / row["ours_s"] / 1e9
                row["torch_gbytes_per_s"] = case["bytes"] / row["torch_s"] / 1e9
        except Exception as e:  # noqa: BLE001  (recorded; the other cases still run)
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows
