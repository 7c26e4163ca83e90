"""Decode mode of ``tvm-fusion bench``: one generation step of a KV-cache decoder against ONNX Runtime, and both
against the step's memory limit measured in the same run.

The step is built from the model's own inputs (:mod:`~tvm_fusion_ext.frontend.decode_inputs`): one new token per row, a cache of
``past`` tokens, a mask of ones, positions ``past``. An ONNX file is built here with symbolic dims wide enough
for the step (the batch, past and total length dims at least ``batch``, ``past`` and ``past + 1``); an artifact
runs as it was compiled (its bounds must admit the step). ONNX Runtime runs the same file on the same inputs
and is the reference of ``max_abs_diff``.

Bytes per step are the weights (every initializer read whole, except a table only gathered from: a row per
token; see :func:`.bandwidth.streamed_weight_bytes`) plus the cached keys and values read; achieved GB/s is
that over the median step; ``of limit`` divides it by the host's read bandwidth, measured in blocks between the
runtime's own blocks of calls (:func:`.bandwidth.time_beside_bandwidth`). A bf16 or int8 artifact streams fewer
bytes than the file: our row's bytes (and the memory limit's) are the artifact's weights, its lookup tables counted
by the rows read, plus the cache; ONNX Runtime's row keeps the file's.
"""

from __future__ import annotations

import importlib.util
import os
import time
from typing import Callable, Dict, Optional, Sequence

from ...deploy.kv_cache import exported_outputs, exported_specs, inplace_feeds, is_inplace
from ...deploy.manifest import is_artifact
from ...errors import InputError, ModelLoadError
from .bandwidth import ReadStream, streamed_weight_bytes, time_beside_bandwidth
from ...frontend.decode_inputs import decode_feeds, decode_shapes, onnx_specs, past_bytes, vocab_of
from .model import max_abs_diff
from .peers import environment, ort_session, set_thread_spinning
from .report import ORT, OURS, Row, kernel_profile

DECODE_RUNTIMES = ("ort",)


def bench_decode(path: str, past: int, batch: int = 1, onnx: Optional[str] = None, repeat: int = 20,
                 against: Sequence[str] = DECODE_RUNTIMES, spin: bool = False, logs: Optional[str] = None,
                 seed: int = 0, kernels: bool = False, out: Callable[[str], None] = print) -> dict:
    """Time one decode step of ``path`` (ONNX file or artifact) at ``batch`` rows against ``past`` cached tokens;
    returns the JSON-able result (``mode`` "decode"). ``kernels``: also time each kernel of our step inside the
    VM (the JSON's ``kernels``: where a step's time goes, attention and the cache's concatenation included)."""
    if past < 0:
        raise InputError(f"--past must be >= 0, got {past}")
    if batch <= 0:
        raise InputError(f"--batch must be positive, got {batch}")
    spinning = set_thread_spinning(spin)
    artifact = is_artifact(path)
    if not artifact and not os.path.isfile(path):
        raise ModelLoadError(f"{path}: no such file")
    t0 = time.perf_counter()
    if artifact:
        model, onnx_path, specs, note = _load_artifact(path, onnx, out)
    else:
        if onnx is not None:
            raise InputError("--onnx is for an artifact: MODEL is the ONNX file itself here")
        onnx_path, specs = path, onnx_specs(path)
    label = os.path.basename(os.path.abspath(path))
    shapes = decode_shapes(specs, batch, past, label)
    vocab = vocab_of(onnx_path, specs)
    feeds = decode_feeds(specs, shapes, past, vocab=vocab, seed=seed)
    kv = getattr(model, "kv_cache", None) if artifact else None
    inplace = is_inplace(kv)
    run_feeds = inplace_feeds(kv, feeds) if inplace else feeds  # an in-place cache: buffers + past_length
    if artifact:
        model.check_inputs(run_feeds)
    else:
        model = _build(path, specs, shapes, logs, out)
        note = "built here, symbolic dims"
    setup_s = time.perf_counter() - t0
    threads = _threads()

    if onnx_path is not None:
        weights = streamed_weight_bytes(onnx_path, batch)
        weight_bytes = weights["weights"] + weights["table_rows_read"]
    else:
        weights, weight_bytes = None, _artifact_weight_bytes(path)
    cache_bytes = past_bytes(specs, feeds)
    step_bytes = weight_bytes + cache_bytes
    # a bf16 or int8 artifact streams its own, fewer weight bytes: ONNX Runtime's step still reads the file's
    precision = (getattr(model, "manifest", {}).get("precision") or {}).get("precision", "fp32") if artifact else "fp32"
    ours_bytes = step_bytes
    if precision != "fp32" and weights is not None:
        ours_bytes = _artifact_weight_bytes(path) - weights["tables"] + weights["table_rows_read"] + cache_bytes

    got = model.run(run_feeds)
    if inplace:  # presents are the whole buffers: ONNX Runtime's are their filled prefix
        got = exported_outputs(kv, got, past + 1)
    sess = ref = None
    if onnx_path is not None and importlib.util.find_spec("onnxruntime") is not None:
        sess = ort_session(onnx_path, threads, spin=spinning["thread_spinning"])
        ort_names = {i.name for i in sess.get_inputs()}
        ort_feeds = {k: v for k, v in feeds.items() if k in ort_names}
        ref = sess.run(None, ort_feeds)
    rows = [Row(OURS, max_abs_diff=max_abs_diff([got[n] for n in model.output_names], ref) if ref else None,
                note=note)]
    stream = ReadStream()
    rows[0].timing, host = time_beside_bandwidth(OURS, model.bind(run_feeds), repeat, stream=stream)
    bandwidth = {OURS: host}
    if "ort" in against:
        if sess is None:
            why = "no ONNX file (pass --onnx FILE)" if onnx_path is None else "onnxruntime not installed"
            rows.append(Row(ORT, note=f"n/a ({why})"))
        else:
            timing, bandwidth[ORT] = time_beside_bandwidth(ORT, lambda: sess.run(None, ort_feeds), repeat,
                                                           stream=stream)
            rows.append(Row(ORT, timing, 0.0, note="reference", extra={"intra_op_threads": threads}))
    del stream  # 256 MiB or more, freed before the kernel profile
    limit_ms = ours_bytes / (host["gb_per_s"] * 1e9) * 1e3
    for r in rows:
        if r.timing is not None:
            # each runtime's share is of its own limit: the bytes it streams over the read bandwidth measured
            # between its own blocks of calls
            gbs = (ours_bytes if r.name == OURS else step_bytes) / (r.timing.median * 1e-3) / 1e9
            beside = bandwidth[r.name]["gb_per_s"]
            r.extra.update(gb_per_s=gbs, share_of_limit=gbs / beside, host_read_gb_per_s=beside)
    ort_row = next((r for r in rows if r.name == ORT and r.timing is not None), None)
    ort_median = ort_row.timing.median if ort_row is not None else None
    out(f"decode step: batch {batch}, past {past}, 1 new token per row; {_mb(weight_bytes)} weights + "
        f"{_mb(cache_bytes)} cached K/V = {_mb(step_bytes)} per step"
        + (f" ({precision} artifact: {_mb(ours_bytes)} per step; the limit and our share are of those)"
           if ours_bytes != step_bytes else ""))
    beside_ort = f"; {bandwidth[ORT]['gb_per_s']:.1f} beside ONNX Runtime's" if ORT in bandwidth else ""
    out(f"host read bandwidth ({host['method']}, over {_mb(host['bytes'])}): {host['gb_per_s']:.1f} GB/s beside "
        f"our step (best {host['best_gb_per_s']:.1f}){beside_ort} -> limit {limit_ms:.3f} ms per step")
    out(format_decode(rows, limit_ms))
    profile = kernel_profile(model, run_feeds, repeat, out) if kernels else None
    return {
        "mode": "decode",
        "model": label,
        "path": os.path.abspath(path),
        "onnx": os.path.abspath(onnx_path) if onnx_path else None,
        "threads": threads,
        "batch": batch,
        "past": past,
        "input_shapes": {k: list(v.shape) for k, v in run_feeds.items()},
        "kv_cache": dict(kv) if kv else {"mode": "concat"},
        "setup_seconds": setup_s,
        "weight_bytes": weight_bytes,
        "weight_breakdown": weights,
        "cache_bytes": cache_bytes,
        "step_bytes": step_bytes,
        "precision": precision,
        "ours_step_bytes": ours_bytes,
        "host_read_bandwidth": host,
        "limit_ms": limit_ms,
        "reference": ORT if ref is not None else None,
        "ratio_vs_ort": rows[0].timing.median / ort_median if ort_median else None,
        "max_abs_diff_vs_ort": rows[0].max_abs_diff,
        "share_of_limit": rows[0].extra.get("share_of_limit"),
        "runtimes": [r.to_dict(ort_median) for r in rows],
        "threading": spinning,
        "environment": environment(),
        "kernels": profile,
    }


def format_decode(rows, limit_ms: float) -> str:
    ort = next((r.timing for r in rows if r.name == ORT and r.timing is not None), None)
    lines = [f"{'runtime':<26}{'median ms':>11}{'p10':>9}{'p90':>9}{'GB/s':>8}{'of limit':>10}{'vs ORT':>9}"
             f"{'max|diff|':>11}"]
    for r in rows:
        if r.timing is None:
            lines.append(f"{r.name:<26}  {r.note}")
            continue
        t = r.timing
        diff = f"{r.max_abs_diff:.2e}" if r.max_abs_diff is not None else "-"
        ratio = f"{t.median / ort.median:.2f}x" if ort else "-"
        lines.append(f"{r.name:<26}{t.median:>11.3f}{t.p10:>9.3f}{t.p90:>9.3f}{r.extra['gb_per_s']:>8.1f}"
                     f"{r.extra['share_of_limit']:>10.0%}{ratio:>9}{diff:>11}")
    lines.append(f"{'memory limit':<26}{limit_ms:>11.3f}{'':>9}{'':>9}{'':>8}{1:>10.0%}")
    return "\n".join(lines)


def _build(path: str, specs, shapes: Dict[str, list], logs: Optional[str], out):
    """The ONNX file built with its symbolic dims as a plain ``compile`` bounds them (by the model, else the
    defaults), widened only where this step needs more (a past beyond the default sequence bound)."""
    from ...frontend.dims import DEFAULT_BATCH_BOUND, DEFAULT_SEQ_BOUND
    from ...frontend import load_onnx
    from ...runtime import CompiledModel

    max_shapes = {}
    for name, (dims, _) in specs.items():
        defaults = [DEFAULT_BATCH_BOUND if k == 0 else DEFAULT_SEQ_BOUND for k in range(len(dims))]
        if any(not isinstance(d, int) and s > low for d, s, low in zip(dims, shapes[name], defaults)):
            max_shapes[name] = [d if isinstance(d, int) else max(s, low)
                                for d, s, low in zip(dims, shapes[name], defaults)]
    t0 = time.perf_counter()
    mod = load_onnx(path, max_shapes=max_shapes or None)
    model = CompiledModel.from_module(mod, "llvm", logs=logs, fuse=True, label=os.path.basename(path))
    out(f"built {path} with fusion + templates in {time.perf_counter() - t0:.1f} s "
        f"(fused: {', '.join(f'{k} {v}' for k, v in model.report.fused.items() if v) or 'nothing'})")
    return model


def _load_artifact(path: str, onnx: Optional[str], out):
    from ...deploy import load
    from .artifact import source_onnx

    t0 = time.perf_counter()
    model = load(path)
    out(f"loaded {path} in {(time.perf_counter() - t0) * 1e3:.1f} ms")
    onnx_path, onnx_note = source_onnx(model.manifest, onnx)
    if onnx_path is None:
        out(f"ONNX Runtime not run: {onnx_note}")
    specs = {name: ([d if isinstance(d, int) else str(d) for d in shape], dtype)
             for name, (shape, dtype) in model.input_specs.items()}
    if is_inplace(model.kv_cache):  # the step is made as for the exported model, then put into the buffers
        out(f"in-place KV cache: buffers of {model.kv_cache['capacity']} positions, written at "
            f"{model.kv_cache['length_input']}")
        specs = {n: (list(shape), dtype) for n, (shape, dtype) in exported_specs(model.kv_cache, specs).items()}
    return model, onnx_path, specs, "artifact"


def _artifact_weight_bytes(path: str) -> int:
    from ...deploy.manifest import WEIGHTS_FILE

    file = os.path.join(path, WEIGHTS_FILE)
    return os.path.getsize(file) if os.path.isfile(file) else 0


def _threads() -> int:
    from ...deploy.threads import usable_cpus

    return len(usable_cpus())


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
