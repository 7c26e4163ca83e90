"""Artifact mode of ``tvm-fusion bench``: a compiled artifact, loaded as a deployment would load it, timed against
ONNX Runtime on the same inputs, PyTorch eager, and the same model built in this process.

The ONNX file for ONNX Runtime (and for realistic token ids) is ``--onnx FILE``, else the source path the
manifest records, if that file still exists and still has the recorded sha256. The JSON has the fields of
model mode (``ratio_vs_ort``, ``max_abs_diff_vs_ort``, ``runtimes``...) plus ``load_seconds``.
"""

from __future__ import annotations

import importlib.util
import os
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from ...errors import InputError
from ..timing import time_block
from .model import DEFAULT_BATCH, DEFAULT_SEQ, hf_export_info, max_abs_diff, torch_row
from .peers import environment, ort_session, set_thread_spinning
from .report import ORT, OURS, Row, format_table, kernel_profile, ort_kernel_profile

INPROC = "tvm_fusion_ext in-process"
STATIC = "tvm_fusion_ext static"
#: ``--against`` entries of artifact mode, in table order: "build" is the same model compiled in this process,
#: "static" the model compiled in this process for exactly the benchmarked shapes (what a symbolic artifact
#: is measured against: it serves every size, a static build one)
ARTIFACT_RUNTIMES = ("ort", "torch", "build", "static")
DEFAULT_ARTIFACT_RUNTIMES = ("ort", "torch", "build")


def source_onnx(manifest: dict, onnx: Optional[str]) -> tuple:
    """``(ONNX path or None, note)``: ``onnx`` if given, else the recorded source when unchanged."""
    if onnx is not None:
        if not os.path.isfile(onnx):
            raise InputError(f"--onnx {onnx}: no such file")
        return onnx, f"ONNX model {onnx}"
    source = manifest.get("source") or {}
    path = source.get("path")
    if not path:
        return None, "no ONNX source recorded (pass --onnx FILE)"
    if not os.path.isfile(path):
        return None, f"the source {path} no longer exists (pass --onnx FILE)"
    from ...deploy.manifest import sha256_of_file

    if source.get("sha256") and sha256_of_file(path) != source["sha256"]:
        return None, f"the source {path} changed since the artifact was compiled (pass --onnx FILE)"
    return path, f"ONNX model {path} (the artifact's source)"


def resolve_dims(specs: Dict[str, tuple], bounds: Dict[str, tuple], batch: Optional[int],
                 seq: Optional[int]) -> Dict[str, List[int]]:
    """Concrete input shapes: a symbolic dim at axis 0 takes ``batch`` (default 1), at axis 1 ``seq`` (default
    128, or the dim's upper bound when lower); a static dim refuses a different value."""
    values: Dict[str, int] = {}
    shapes = {}
    for name, (shape, _) in specs.items():
        out = []
        for axis, dim in enumerate(shape):
            asked = batch if axis == 0 else seq if axis == 1 else None
            if isinstance(dim, int):
                if asked is not None and asked != dim:
                    flag = "--batch" if axis == 0 else "--seq"
                    raise InputError(f"input '{name}' has static dim {axis} = {dim}; {flag} {asked} needs an "
                                     f"artifact compiled with a symbolic dim there")
                out.append(dim)
                continue
            if dim not in values:
                if axis > 1 and asked is None:
                    raise InputError(f"input '{name}' dim {axis} ('{dim}') is symbolic; bench sets only batch "
                                     f"(dim 0) and sequence (dim 1)")
                hi = bounds.get(dim, (1, None))[1]
                default = DEFAULT_BATCH if axis == 0 else DEFAULT_SEQ if hi is None else min(DEFAULT_SEQ, hi)
                values[dim] = int(asked if asked is not None else default)
            out.append(values[dim])
        shapes[name] = out
    return shapes


def inputs_from_specs(specs: Dict[str, tuple], shapes: Dict[str, List[int]], seed: int = 0) -> Dict[str, np.ndarray]:
    """Valid inputs without the ONNX file: as :func:`~tvm_fusion_ext.models.sample_inputs` does when it cannot
    see the embedding table (ids 0 or 1, valid for any table)."""
    from ...models import padding_mask

    rng = np.random.default_rng(seed)
    out = {}
    for name, (_, dtype) in specs.items():
        shape, low = tuple(shapes[name]), name.lower()
        if np.issubdtype(np.dtype(dtype), np.floating):
            out[name] = rng.standard_normal(shape).astype(dtype)
        elif "mask" in low and len(shape) == 2:
            out[name] = padding_mask(*shape).astype(dtype)
        elif "token_type" in low or "segment" in low:
            out[name] = np.zeros(shape, dtype)
        else:
            out[name] = rng.integers(0, 2, size=shape).astype(dtype)
    return out


def bench_artifact(path: str, onnx: Optional[str] = None, against: Sequence[str] = DEFAULT_ARTIFACT_RUNTIMES,
                   seq: Optional[int] = None, batch: Optional[int] = None, repeat: int = 20, spin: bool = False,
                   torch_model: Optional[str] = None, out: Callable[[str], None] = print,
                   feeds: Optional[Dict[str, np.ndarray]] = None, kernels: bool = False) -> dict:
    """Load, check and time the artifact ``path`` against ``against``; returns the JSON-able result.
    ``feeds``: the inputs to time on, by ONNX name (``--inputs``), instead of generated ones. ``kernels``: also time
    each kernel of the artifact's call (:func:`~tvm_fusion_ext.deploy.profile_kernels`; the JSON's ``kernels``)."""
    spinning = set_thread_spinning(spin)  # before the load configures TVM's pool
    import tvm.runtime.vm  # noqa: F401  (importing TVM is a process's one-time cost, not the artifact's)

    from ...deploy import load

    t0 = time.perf_counter()
    model = load(path)
    load_s = time.perf_counter() - t0
    manifest = model.manifest
    threads = _threads()
    held = {"huge": "; weights on 2 MiB pages", "file": "; weights file mapped"}.get(model.weight_pages, "")
    out(f"loaded {path} in {load_s * 1e3:.1f} ms ({manifest['target']['string']}{held})")
    onnx_path, onnx_note = source_onnx(manifest, onnx)
    if feeds is not None:
        model.check_inputs(feeds)  # names, dtypes, shapes and bounds, in one line, before any runtime sees them
        feeds = dict(feeds)
        shapes = {name: list(np.shape(x)) for name, x in feeds.items()}
    else:
        shapes = resolve_dims(model.input_specs, model.dim_bounds, batch, seq)
        if onnx_path is not None:
            from ...models import sample_inputs

            feeds = sample_inputs(onnx_path, seed=0, shapes=shapes)
        else:
            feeds = inputs_from_specs(model.input_specs, shapes)
    if onnx_path is None:
        out(f"ONNX Runtime not run: {onnx_note}")
    got = model.run(feeds)

    sess = ref = None
    if onnx_path is not None and importlib.util.find_spec("onnxruntime") is not None:
        sess = ort_session(onnx_path, threads, spin=spinning["thread_spinning"])
        ort_names = {i.name for i in sess.get_inputs()}
        ort_feeds = {k: v for k, v in feeds.items() if k in ort_names}
        ref = sess.run(None, ort_feeds)

    def diff(outputs):
        return max_abs_diff(outputs, ref) if ref is not None else None

    rows = [Row(OURS, max_abs_diff=diff([got[n] for n in model.output_names]), note="artifact",
                extra={"load_seconds": load_s})]
    rows[0].timing = time_block(OURS, model.bind(feeds), repeat=repeat)
    if "ort" in against:
        if sess is None:
            rows.append(Row(ORT, note="n/a (" + (onnx_note if onnx_path is None else "onnxruntime not installed")
                                      + ")"))
        else:
            rows.append(Row(ORT, time_block(ORT, lambda: sess.run(None, ort_feeds), repeat=repeat), 0.0,
                            note="reference", extra={"intra_op_threads": threads}))
    if "torch" in against:
        info = hf_export_info(onnx_path) if onnx_path is not None else None
        if torch_model is not None:
            info = dict(info or {}, kind=torch_model)
        rows.append(torch_row(info, feeds, ref, threads, repeat))
    if "build" in against:
        rows.append(_inprocess_row(manifest, onnx_path, onnx_note, feeds, diff, repeat))
    if "static" in against:
        rows.append(_inprocess_row(manifest, onnx_path, onnx_note, feeds, diff, repeat, static=True))

    ort_row = next((r for r in rows if r.name == ORT and r.timing is not None), None)
    ort_median = ort_row.timing.median if ort_row is not None else None
    out(format_table(rows))
    profile = kernel_profile(model, feeds, repeat, out) if kernels else None
    ort_profile = (ort_kernel_profile(onnx_path, ort_feeds, threads, spinning["thread_spinning"], repeat, out)
                   if kernels and "ort" in against and sess is not None else None)
    fusion = manifest.get("fusion") or {}
    first = next(iter(shapes.values()), [])
    return {
        "mode": "artifact",
        "model": os.path.basename(os.path.abspath(path)),
        "path": os.path.abspath(path),
        "onnx": os.path.abspath(onnx_path) if onnx_path else None,
        "target": manifest["target"]["kind"],
        "threads": threads,
        "batch": first[0] if len(first) > 0 else None,
        "seq": first[1] if len(first) > 1 else None,
        "input_shapes": {k: list(v.shape) for k, v in feeds.items()},
        "logs": (manifest.get("records") or {}).get("dir"),
        "fused": fusion.get("fused"),
        "reference": ORT if ref is not None else None,
        "ratio_vs_ort": rows[0].timing.median / ort_median if ort_median else None,
        "max_abs_diff_vs_ort": rows[0].max_abs_diff,
        "load_seconds": load_s,
        "weight_pages": model.weight_pages,
        "runtimes": [r.to_dict(ort_median) for r in rows],
        "threading": spinning,
        "environment": environment(),
        "kernels": profile,
        "ort_kernels": ort_profile,
    }


def _threads() -> int:
    from ...deploy.threads import usable_cpus

    return len(usable_cpus())


def _inprocess_row(manifest: dict, onnx_path: Optional[str], onnx_note: str, feeds, diff, repeat,
                   static: bool = False) -> Row:
    """The same ONNX model, target and tuning records, compiled in this process: as the artifact was (what it
    replaces), or with ``static`` for exactly the shapes of ``feeds`` (what a symbolic artifact competes with)."""
    name = STATIC if static else INPROC
    if onnx_path is None:
        return Row(name, note=f"n/a ({onnx_note})")
    from ...frontend import load_onnx
    from ...runtime import CompiledModel

    source = manifest.get("source") or {}
    # the record directory applied, else the logs whose knobs reached kernels (a symbolic artifact's)
    records = (manifest.get("records") or {}).get("dir") or (manifest.get("records") or {}).get("logs")
    logs = records if records and os.path.isdir(records) else None
    kwargs = {"max_shapes": source["max_shapes"]} if source.get("max_shapes") and not static else {}
    shapes = {k: list(v.shape) for k, v in feeds.items()} if static else source.get("shapes")
    t0 = time.perf_counter()
    mod = load_onnx(onnx_path, shapes=shapes, **kwargs)
    built = CompiledModel.from_module(mod, manifest["target"]["config"], logs=logs,
                                      fuse=manifest.get("fusion") is not None, label=onnx_path)
    build_s = time.perf_counter() - t0
    got = built.run(feeds)
    return Row(name, time_block(name, built.bind(feeds), repeat=repeat),
               diff([got[n] for n in built.output_names]), extra={"build_seconds": build_s})
