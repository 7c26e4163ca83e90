"""The campaign's ``e2e`` part: whole models in fp16, ours against torch, with weights made there from a seed.

BERT-base (12 layers, hidden 768) and a LLaMA-shaped prefill (hidden 2048, 16 heads, 4 K/V heads, intermediate
5632, 4 layers) are exported from transformers with weights drawn by numpy from a seed
(:mod:`.e2e_models`), imported, cast to fp16 and compiled for CUDA **once each with symbolic batch and sequence**
(one library per model: a CUDA library is compiled from its source as it loads there, so every library costs
an nvcc run on the GPU machine), with the weights lifted out of the library as trailing parameters of ``main``
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
``torch.compile`` (one shape per model: compiling costs tens of seconds).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from . import e2e_models as em

#: seconds the full part is expected to take on an H100/H200: weights drawn (~2 s BERT, ~3 s LLaMA), two nvcc
#: compiles at load (~20 s each), 12 shapes × (one checked call, a timing of each, an fp32 reference), and two
#: ``torch.compile`` runs (~30 s each)
EXPECTED_S = 150
SEED = 0
FULL_MODELS = ("bert-base", "llama-2048")
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
    recipes, carried = [], {}
    for pname, value in lifted:
        value = np.asarray(value)
        recipe = _whole(value, forms) or _concat(value, lines) or _stack(value, forms, lines)
        if recipe is None:
            if value.nbytes > CARRY_LIMIT:
                raise SystemExit(f"e2e: lifted weight {pname} {list(value.shape)} {value.dtype} is no parameter, "
                                 f"transpose, concatenation or stack of the model's weights, and too large to carry "
                                 f"({value.nbytes / 2**20:.1f} MiB)")
            recipe = {"carried": pname}
            carried[pname] = value
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
    """Each model exported, compiled once (symbolic batch and sequence) and written as ``NAME.so`` with its
    recipe in ``e2e.json`` and any small constants in ``NAME.constants.npz``."""
    import tempfile

    from tvm_fusion_ext.compile.pipeline import compile_model
    from tvm_fusion_ext.frontend import load_onnx
    from tvm_fusion_ext.tools.inspect_cuda import convert_dtype

    out_dir.mkdir(parents=True, exist_ok=True)
    shapes = em.QUICK_SHAPES if quick else em.SHAPES
    max_batch, max_seq = max(b for b, _ in shapes), max(s for _, s in shapes)
    on_cpu = target.kind.name == "llvm"
    dtype = "float32" if on_cpu else "float16"  # the CPU rehearsal's kernels in fp32 (no fp16 dense template there)
    entries = []
    for name in (QUICK_MODELS if quick else FULL_MODELS):
        start = time.time()
        weights = em.make_weights(name, SEED)
        with tempfile.TemporaryDirectory() as tmp:
            onnx_path = Path(tmp) / f"{name}.onnx"
            _export_onnx(name, weights, onnx_path)
            mod = load_onnx(str(onnx_path), max_shapes={n: [max_batch, max_seq] for n in em.input_names(name)})
        mod = convert_dtype(mod, dtype)
        inputs = [p.name for p in mod["main"].params]  # main's inputs as imported, in order
        if set(inputs) - set(em.input_names(name)):
            raise SystemExit(f"e2e {name}: the imported model takes {inputs}, not {list(em.input_names(name))}")
        with target:
            compiled = compile_model(mod, target, lift_weights=True)
        library = f"{name}.so"
        compiled.executable.export_library(str(out_dir / library))
        drawn = {k: v.astype(dtype) for k, v in weights.items()}
        recipes, carried = derive_recipes(compiled.weights, drawn)
        if carried:
            np.savez(out_dir / f"{name}.constants.npz", **carried)
        entries.append({"model": name, "config": em.MODELS[name], "seed": SEED, "dtype": dtype,
                        "fingerprint": em.weights_fingerprint(drawn), "library": library,
                        "inputs": inputs, "shapes": [list(s) for s in shapes],
                        "weights": recipes, "carried": sorted(carried)})
        print(f"built e2e/{name}: {len(recipes)} weight parameters ({len(carried)} carried), "
              f"{(out_dir / library).stat().st_size / 2**20:.1f} MiB library ({time.time() - start:.0f} s)", flush=True)
    (out_dir / "e2e.json").write_text(json.dumps({"part": "e2e", "models": entries}, indent=1))
    return entries


# -- run (there: numpy, torch, tvm.runtime) -----------------------------------------------------------------------
def weight_arguments(entry: dict, in_dir: Path, torch_device: str):
    """``(torch params by name, [main's weight arguments as torch tensors])`` for ``entry``, drawn from its seed."""
    import torch

    drawn = {k: v.astype(entry["dtype"]) for k, v in em.make_weights(entry["model"], entry["seed"]).items()}
    if abs(em.weights_fingerprint(drawn) - entry["fingerprint"]) > 1e-6 * max(1.0, abs(entry["fingerprint"])):
        raise RuntimeError("the weights drawn here differ from the build's (numpy's generator gave other numbers)")
    params = {k: torch.from_numpy(v).to(torch_device) for k, v in drawn.items()}
    carried = np.load(in_dir / f"{entry['model']}.constants.npz") if entry["carried"] else {}

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
    on one shape per model (batch 8 × 512 in the full part), torch_compile_s, skipped when the model has taken
    ``budget_s`` by then (its compile alone can take tens of seconds). Errors are recorded, never fatal."""
    import torch
    import tvm
    from tvm.runtime.vm import VirtualMachine

    index = json.loads((in_dir / "e2e.json").read_text())
    rows = []
    for entry in index["models"]:
        name = entry["model"]
        try:
            start = time.time()
            params, weight_args = weight_arguments(entry, in_dir, torch_device)
            params32 = {k: v.float() for k, v in params.items()}
            vm = VirtualMachine(tvm.runtime.load_module(str(in_dir / entry["library"])), tvm_dev)
            setup_s = time.time() - start
        except Exception as e:  # noqa: BLE001
            rows.append({"name": f"e2e_{name}", "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"})
            print(json.dumps(rows[-1]), flush=True)
            continue
        weights_tvm = [tvm.runtime.from_dlpack(t) for t in weight_args]
        compile_shape = entry["shapes"][len(entry["shapes"]) // 2]  # one shape per model: compiling costs
        for batch, seq in entry["shapes"]:
            row = {"name": f"e2e_{name}_b{batch}_s{seq}", "model": name, "batch": batch, "seq": seq,
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
                    if [batch, seq] == compile_shape and torch_device == "cuda" and \
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
        del params, params32, weight_args, weights_tvm, vm
        if torch_device == "cuda":
            torch.cuda.empty_cache()
    return rows
