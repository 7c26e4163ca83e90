"""The campaign's ``e2e`` part: whole models in fp16, ours against torch, with weights made there from a seed.

BERT-base (12 layers, hidden 768) and a LLaMA-shaped prefill (hidden 2048, 16 heads, 4 K/V heads, intermediate
5632, 4 layers) are exported from transformers with weights drawn by numpy from a seed
(:mod:`.e2e_models`), imported, cast to fp16 and compiled for CUDA twice: **with symbolic batch and sequence**
(``dynamic``, the deployable artifact, measured at every shape; its dense kernels are SIMT, since the tensor-core
template needs static rows) and **at batch 8 × 512** (``static``: tensor-core dense). Every library costs an nvcc
run there (a CUDA library is compiled from its source as it loads), hence four, not one per shape. The weights
are lifted out of each library as trailing parameters of ``main``
(:func:`~tvm_fusion_ext.compile.codegen.weights.lift_weights`). Nothing of the weights is carried: what the
library takes is the weights as its kernels read them (QKV projections concatenated, matrices transposed, gate
and up projections stacked), so the build writes a **recipe** per lifted parameter, derived here by comparing
values with the drawn weights: a transformers parameter (or its transpose), a concatenation of such along an
axis, a stack of such on a new axis, or, for a small constant folded from several (a table of positions), its
value, carried in ``NAME.constants.npz``.

Run side (numpy and torch): draw the same weights, check their fingerprint, build ``main``'s weight arguments
by the recipe, and per shape (batch 1/8/32 × 128/512 tokens) compare ours with the plain-torch forward pass in
fp16 (and both with it in fp32: ours is judged against the fp32 result, with torch fp16's own error as the
scale) and time ours (``time_evaluator`` on the VM) against torch fp16 eager and, where it works there,
``torch.compile`` (on the static variant's shape only: compiling costs tens of seconds).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from . import e2e_models as em

#: seconds the full part is expected to take on an H100/H200: weights drawn (~5 s BERT, ~8 s LLaMA), four nvcc
#: compiles at load (~15 s each), 14 shapes × (one checked call, a timing of each, an fp32 reference: ~3 s), and
#: two ``torch.compile`` runs (~30 s each)
EXPECTED_S = 170
SEED = 0
FULL_MODELS = ("bert-base", "llama-2048")
#: the shape of the static (tensor-core) variant of each model, and of its torch.compile row
STATIC_SHAPE = (8, 512)
QUICK_MODELS = ("bert-tiny", "llama-tiny")
#: a lifted constant no recipe explains is carried as it is up to this size (a position or rotary table)
CARRY_LIMIT = 4 << 20


# -- build (here) -------------------------------------------------------------------------------------------------
def _export_onnx(name: str, weights: Dict[str, np.ndarray], path: Path) -> None:
    """The transformers model with ``weights`` exported (legacy exporter, batch and sequence dynamic)."""
    import contextlib
    import io
    import warnings

    import torch
    import transformers

    c = dict(em.MODELS[name])
    family = c.pop("family")
    if family == "bert":
        model = transformers.BertModel(transformers.BertConfig(**c, attn_implementation="sdpa"), add_pooling_layer=False)
    else:
        model = transformers.LlamaModel(transformers.LlamaConfig(**c, attn_implementation="sdpa"))
    missing = {n for n, _ in model.named_parameters()} ^ set(weights)
    if missing:
        raise SystemExit(f"e2e {name}: the drawn weights do not name transformers' parameters ({sorted(missing)[:3]})")
    model.load_state_dict({k: torch.from_numpy(v.astype(np.float32)) for k, v in weights.items()}, strict=False)
    names = em.input_names(name)

    class _Forward(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, *inputs):
            return self.m(**dict(zip(names, inputs))).last_hidden_state

    example = em.make_inputs(name, 2, 16, SEED)
    axes = {0: "batch", 1: "seq"}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Forward().eval(), tuple(torch.from_numpy(example[n]) for n in names), str(path),
                          dynamo=False, opset_version=17, input_names=list(names),
                          output_names=["last_hidden_state"],
                          dynamic_axes={**{n: axes for n in names}, "last_hidden_state": axes})


def _key(a: np.ndarray) -> bytes:
    return hashlib.sha1(np.ascontiguousarray(a).tobytes()).digest() + str(a.dtype).encode()


def derive_recipes(lifted, weights: Dict[str, np.ndarray]):
    """Per lifted parameter, how to make it from the drawn ``weights``: ``{"param": name, "transpose": bool}``,
    ``{"concat": [such], "axis": a}``, ``{"stack": [such or concats], "axis": a}`` (a new axis) or
    ``{"carried": key}`` (small constants only); returns ``(recipes,
    carried arrays)``. Values are compared exactly: random fp16 weights do not coincide."""
    forms = {}       # whole-array key -> form
    lines = {}       # (axis, key of the form's first line along it) -> [forms]
    for pname, w in weights.items():
        for transpose in ((False, True) if w.ndim == 2 else (False,)):
            a = w.T if transpose else w
            form = {"param": pname, "transpose": transpose, "array": a}
            forms.setdefault(_key(a), form)
            for axis in range(a.ndim):
                lines.setdefault((axis, a.shape[:axis] + a.shape[axis + 1:], _key(np.take(a, 0, axis=axis))),
                                 []).append(form)
    recipes, carried, carried_keys = [], {}, {}
    for pname, value in lifted:
        value = np.asarray(value)
        recipe = _whole(value, forms) or _concat(value, lines) or _stack(value, forms, lines)
        if recipe is None:
            if value.nbytes > CARRY_LIMIT:
                raise SystemExit(f"e2e: lifted weight {pname} {list(value.shape)} {value.dtype} is no parameter, "
                                 f"transpose, concatenation or stack of the model's weights, and too large to carry "
                                 f"({value.nbytes / 2**20:.1f} MiB)")
            # one copy of equal constants (each layer's rotary tables are the same table)
            key = carried_keys.setdefault(_key(value) + str(value.shape).encode(), pname)
            recipe = {"carried": key}
            carried.setdefault(key, value)
        recipes.append(dict(recipe, name=pname, shape=list(value.shape), dtype=str(value.dtype)))
    return recipes, carried


def _whole(value, forms):
    form = forms.get(_key(value))
    if form is None:  # the same bytes in another shape (a reshape)
        for f in forms.values():
            if f["array"].size == value.size and f["array"].dtype == value.dtype and \
                    np.array_equal(np.ascontiguousarray(f["array"]).reshape(value.shape), value):
                form = f
                break
        else:
            return None
    return {"param": form["param"], "transpose": form["transpose"]}


def _concat(value, lines):
    for axis in range(value.ndim):
        rest = value.shape[:axis] + value.shape[axis + 1:]
        parts, offset = [], 0
        while offset < value.shape[axis]:
            head = np.take(value, offset, axis=axis)
            found = None
            for form in lines.get((axis, rest, _key(head)), []):
                width = form["array"].shape[axis]
                if offset + width <= value.shape[axis] and np.array_equal(
                        np.take(value, range(offset, offset + width), axis=axis), form["array"]):
                    found = form
                    break
            if found is None:
                break
            parts.append({"param": found["param"], "transpose": found["transpose"]})
            offset += found["array"].shape[axis]
        if offset == value.shape[axis] and len(parts) > 1:
            return {"concat": parts, "axis": axis}
    return None


def _stack(value, forms, lines):
    """A short axis whose slices are each a parameter (or a concatenation): a gated MLP's gate and up projections
    side by side, ``[K, N, 2]``."""
    for axis in range(value.ndim):
        if not 1 < value.shape[axis] <= 4:
            continue
        parts = []
        for g in range(value.shape[axis]):
            part = np.take(value, g, axis=axis)
            found = _whole(part, forms) or _concat(part, lines)
            if found is None:
                break
            parts.append(found)
        else:
            return {"stack": parts, "axis": axis}
    return None


def build(out_dir: Path, target, quick: bool = False) -> List[dict]:
    """Each model exported once and compiled twice: with symbolic batch and sequence (``dynamic``: the deployable
    artifact, measured at every shape; its dense kernels are SIMT, since the tensor-core template needs static
    rows) and at one static shape (``static``: tensor-core dense, the kernels a fixed-shape deployment gets). Each
    library is ``NAME-VARIANT.so`` with its recipe in ``e2e.json`` and any small constants beside it."""
    import tempfile

    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.tools.inspect_cuda import convert_dtype

    out_dir.mkdir(parents=True, exist_ok=True)
    shapes = em.QUICK_SHAPES if quick else em.SHAPES
    static = em.QUICK_SHAPES[-1] if quick else STATIC_SHAPE
    max_batch, max_seq = max(b for b, _ in shapes), max(s for _, s in shapes)
    dtype = "float32" if target.kind.name == "llvm" else "float16"  # the CPU rehearsal's kernels in fp32
    entries = []
    for name in (QUICK_MODELS if quick else FULL_MODELS):
        weights = em.make_weights(name, SEED)
        drawn = {k: v.astype(dtype) for k, v in weights.items()}
        variants = [("dynamic", shapes, {"max_shapes": {n: [max_batch, max_seq] for n in em.input_names(name)}})]
        if not quick or name == QUICK_MODELS[0]:  # the rehearsal builds one static variant: it is slow here
            variants.append(("static", [static], {"shapes": {n: list(static) for n in em.input_names(name)}}))
        with tempfile.TemporaryDirectory() as tmp:
            onnx_path = Path(tmp) / f"{name}.onnx"
            _export_onnx(name, weights, onnx_path)
            for variant, variant_shapes, dims in variants:
                start = time.time()
                mod = convert_dtype(load_onnx(str(onnx_path), **dims), dtype)
                entry = _compile_variant(mod, name, variant, target, drawn, out_dir)
                entries.append(dict(entry, config=em.MODELS[name], seed=SEED, dtype=dtype,
                                    fingerprint=em.weights_fingerprint(drawn),
                                    shapes=[list(s) for s in variant_shapes]))
                print(f"built e2e/{name} {variant}: {entry['cuda_kernels']} CUDA kernels "
                      f"({entry['tensor_core_kernels']} on tensor cores), {len(entry['weights'])} weight parameters "
                      f"({len(entry['carried'])} carried), {(out_dir / entry['library']).stat().st_size / 2**20:.1f} "
                      f"MiB library ({time.time() - start:.0f} s)", flush=True)
    (out_dir / "e2e.json").write_text(json.dumps({"part": "e2e", "models": entries}, indent=1))
    return entries


def _compile_variant(mod, name: str, variant: str, target, drawn, out_dir: Path) -> dict:
    from tvm_fusion_ext.compile.pipeline import compile_model

    inputs = [p.name for p in mod["main"].params]  # main's inputs as imported, in order
    if set(inputs) - set(em.input_names(name)):
        raise SystemExit(f"e2e {name}: the imported model takes {inputs}, not {list(em.input_names(name))}")
    with target:
        compiled = compile_model(mod, target, lift_weights=True)
    library = f"{name}-{variant}.so"
    compiled.executable.export_library(str(out_dir / library))
    recipes, carried = derive_recipes(compiled.weights, drawn)
    constants = f"{name}-{variant}.constants.npz"
    if carried:
        np.savez_compressed(out_dir / constants, **carried)  # masks and tables: they compress
    return {"model": name, "variant": variant, "library": library, "inputs": inputs, "weights": recipes,
            "carried": sorted(carried), "constants": constants, **_cuda_kernels(compiled.executable)}


def _cuda_kernels(executable) -> dict:
    """How many CUDA kernels the library holds and how many of them use tensor cores (``mma.sync``)."""
    import re

    from tvm_fusion_ext.tools.inspect_cuda import cuda_sources

    kernels = {}
    for src in cuda_sources(executable):
        parts = re.split(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(', src)
        for kernel, body in zip(parts[1::2], parts[2::2]):
            kernels[kernel] = kernels.get(kernel, False) or "mma.sync" in body.split('extern "C"')[0]
    return {"cuda_kernels": len(kernels), "tensor_core_kernels": sum(kernels.values())}


# -- run (there: numpy, torch, tvm.runtime) -----------------------------------------------------------------------
def drawn_params(entry: dict, torch_device: str) -> dict:
    """The model's weights drawn from its seed as torch tensors on the device, by transformers name."""
    import torch

    drawn = {k: v.astype(entry["dtype"]) for k, v in em.make_weights(entry["model"], entry["seed"]).items()}
    if abs(em.weights_fingerprint(drawn) - entry["fingerprint"]) > 1e-6 * max(1.0, abs(entry["fingerprint"])):
        raise RuntimeError("the weights drawn here differ from the build's (numpy's generator gave other numbers)")
    return {k: torch.from_numpy(v).to(torch_device) for k, v in drawn.items()}


def weight_arguments(entry: dict, in_dir: Path, torch_device: str, params: Optional[dict] = None):
    """``(torch params by name, [main's weight arguments as torch tensors])`` for ``entry`` (``params``: the
    model's drawn weights, when another variant of it drew them already)."""
    import torch

    params = params if params is not None else drawn_params(entry, torch_device)
    carried = np.load(in_dir / entry["constants"]) if entry["carried"] else {}

    def form(part):
        if "concat" in part:
            return torch.cat([form(p) for p in part["concat"]], dim=part["axis"])
        if "stack" in part:
            return torch.stack([form(p) for p in part["stack"]], dim=part["axis"])
        t = params[part["param"]]
        return t.t() if part["transpose"] else t

    args = []
    for recipe in entry["weights"]:
        if "carried" in recipe:
            t = torch.from_numpy(np.ascontiguousarray(carried[recipe["carried"]])).to(torch_device)
        else:
            t = form(recipe)
        args.append(t.reshape(recipe["shape"]).contiguous().clone())  # clone: TVM wants its own aligned buffer
    return params, args


def _time_compiled(torch, fn, torch_time, number):
    compiled = torch.compile(fn)
    compiled()  # compiles
    return torch_time(torch, compiled, number=number)


def run(in_dir: Path, tvm_dev, torch_device: str, torch_time, budget_s: Optional[float] = 90.0) -> List[dict]:
    """One row per model and shape: max |ours - torch fp16|, both against torch fp32, ours_s, torch_s (eager) and,
    on the static variant's shape, torch_compile_s, skipped when the variant has taken ``budget_s`` by then (its compile alone can take tens of seconds). Errors are recorded, never fatal."""
    import torch
    import tvm
    from tvm.runtime.vm import VirtualMachine

    index = json.loads((in_dir / "e2e.json").read_text())
    rows = []
    drawn = (None, None, None)  # (model, its params, their fp32 copies): variants of a model share one draw
    for entry in index["models"]:
        name = entry["model"]
        try:
            start = time.time()
            if drawn[0] != name:
                drawn = (None, None, None)
                if torch_device == "cuda":
                    torch.cuda.empty_cache()
                params = drawn_params(entry, torch_device)
                drawn = (name, params, {k: v.float() for k, v in params.items()})
            _, params, params32 = drawn
            params, weight_args = weight_arguments(entry, in_dir, torch_device, params)
            vm = VirtualMachine(tvm.runtime.load_module(str(in_dir / entry["library"])), tvm_dev)
            setup_s = time.time() - start
        except Exception as e:  # noqa: BLE001
            rows.append({"name": f"e2e_{name}", "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"})
            print(json.dumps(rows[-1]), flush=True)
            continue
        weights_tvm = [tvm.runtime.from_dlpack(t) for t in weight_args]
        variant = entry.get("variant", "dynamic")
        for batch, seq in entry["shapes"]:
            row = {"name": f"e2e_{name}_{variant}_b{batch}_s{seq}", "model": name, "variant": variant,
                   "batch": batch, "seq": seq, "tensor_core_kernels": entry.get("tensor_core_kernels"),
                   "setup_s": round(setup_s, 1)}
            try:
                inputs = em.make_inputs(name, batch, seq, entry["seed"])
                feeds = [torch.from_numpy(inputs[n]).to(torch_device).clone() for n in entry["inputs"]]
                args = [tvm.runtime.from_dlpack(t) for t in feeds] + weights_tvm
                got = torch.from_dlpack(vm["main"](*args)).float()
                with torch.no_grad():
                    ids = feeds[entry["inputs"].index("input_ids")]
                    eager = lambda: em.torch_forward(name, params, ids)  # noqa: E731
                    want16 = eager().float()
                    want32 = em.torch_forward(name, params32, ids)
                    row["max_abs_vs_torch"] = float((got - want16).abs().max())
                    row["ours_vs_fp32"] = float((got - want32).abs().max())
                    row["torch_fp16_vs_fp32"] = float((want16 - want32).abs().max())
                    # ours within 3× torch fp16's own distance from fp32 (or 2e-2, for tiny distances)
                    row["ok"] = bool(np.isfinite(row["ours_vs_fp32"]) and
                                     row["ours_vs_fp32"] <= max(3 * row["torch_fp16_vs_fp32"], 2e-2))
                    flops = 2 * batch * seq * sum(int(np.prod(r["shape"])) for r in entry["weights"]
                                                  if len(r["shape"]) >= 2 and "embed" not in str(r.get("param")))
                    # about 0.3 s of work per timing loop on a GPU; the CPU rehearsal only proves the path
                    number = max(2, min(20, int(2e13 * 0.3 / max(flops, 1)))) if torch_device == "cuda" else 2
                    timer = vm.time_evaluator("main", tvm_dev, number=number, repeat=3)
                    row["ours_s"] = float(min(timer(*args).results))
                    row["torch_s"] = torch_time(torch, eager, number=number)
                    row["ours_over_torch"] = row["ours_s"] / row["torch_s"]
                    if variant == "static" and torch_device == "cuda" and \
                            (budget_s is None or time.time() - start < budget_s):
                        try:
                            row["torch_compile_s"] = _time_compiled(torch, eager, torch_time, number)
                            row["ours_over_torch_compile"] = row["ours_s"] / row["torch_compile_s"]
                        except Exception as e:  # noqa: BLE001  (torch.compile may be unusable there)
                            row["torch_compile_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            except Exception as e:  # noqa: BLE001
                row["ok"] = False
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            rows.append(row)
            print(json.dumps(row), flush=True)
        del weight_args, weights_tvm, vm
    return rows
