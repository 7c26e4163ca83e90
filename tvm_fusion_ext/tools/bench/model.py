"""Model mode of ``tvm-fusion bench``: this package against ONNX Runtime, PyTorch eager and stock TVM, in one run.

The model is built with fusion + templates (and tuning logs); every runtime runs on the same inputs, is checked
against ONNX Runtime's outputs and is timed in its own block of calls (see :mod:`..timing` for why never call by
call).

PyTorch eager needs the torch module, which an ONNX file does not carry. It is rebuilt from
:func:`tvm_fusion_ext.models.hf_model` when the file was exported by :func:`~tvm_fusion_ext.models.export_hf_model`
(which records its arguments in the ONNX ``metadata_props`` under ``HF_EXPORT_KEY``), or when
``--torch minilm|bert-base`` says which model the file is; otherwise the torch row reads "n/a (not a
transformers export)".
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...errors import InputError, ModelLoadError
from ...models import HF_EXPORT_KEY
from ..timing import time_block
from .lengths import MASK_INPUT, apply_lengths, draw_lengths, valid_positions
from .peers import check_target, environment, ort_session, set_thread_spinning, stock_tvm, threads_for, torch_runner
from .report import (ORT, OURS, OURS_PADDED, RUNTIMES, STOCK, TORCH, Row, format_table, kernel_profile,
                     ort_kernel_profile)

DEFAULT_SEQ, DEFAULT_BATCH = 128, 1


def hf_export_info(path: str) -> Optional[dict]:
    """The :func:`.models.export_hf_model` arguments recorded in the file, or None."""
    import onnx

    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception:  # noqa: BLE001  (load_onnx reports unreadable files with a better message)
        return None
    for prop in proto.metadata_props:
        if prop.key == HF_EXPORT_KEY:
            try:
                return json.loads(prop.value)
            except ValueError:
                return None
    return None


def _static_dims(path: str) -> Dict[str, List[Optional[int]]]:
    import onnx

    proto = onnx.load(path, load_external_data=False)
    inits = {t.name for t in proto.graph.initializer}
    dims = {}
    for vi in proto.graph.input:
        if vi.name not in inits:
            dims[vi.name] = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                             for d in vi.type.tensor_type.shape.dim]
    return dims


def _resolve_shapes(path: str, seq: Optional[int], batch: Optional[int]):
    """``(shapes for load_onnx or None, batch, seq)``. Dynamic dims 0/1 take ``batch``/``seq`` (default 1/128);
    a static model refuses a different ``seq``/``batch`` (our own exports are re-exported by the caller)."""
    dims = _static_dims(path)
    shapes, dynamic = {}, False
    for name, d in dims.items():
        new = list(d)
        for axis, val, default in ((0, batch, DEFAULT_BATCH), (1, seq, DEFAULT_SEQ)):
            if axis >= len(new):
                continue
            if new[axis] is None:
                new[axis], dynamic = int(val or default), True
            elif val is not None and int(val) != new[axis]:
                flag = "--batch" if axis == 0 else "--seq"
                raise InputError(f"{path}: input '{name}' has static dim {axis} = {new[axis]}; {flag} {val} "
                                 f"needs a model with a dynamic dim there")
        if any(x is None for x in new):
            raise InputError(f"{path}: input '{name}' has dynamic dims beyond batch and sequence ({d})")
        shapes[name] = new
    first = next(iter(shapes.values()), [])
    return (shapes if dynamic else None), (first[0] if len(first) > 0 else None), \
        (first[1] if len(first) > 1 else None)


def max_abs_diff(got: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> float:
    return max(float(np.abs(np.asarray(g, dtype=np.float64) - r).max()) for g, r in zip(got, ref))


def bench_model(path: str, logs: Optional[str] = None, against: Sequence[str] = RUNTIMES,
                seq: Optional[int] = None, batch: Optional[int] = None, target: str = "llvm", repeat: int = 20,
                torch_model: Optional[str] = None, stock_repeat: int = 3, stock_seconds: float = 10.0,
                label: Optional[str] = None, spin: bool = False, out: Callable[[str], None] = print,
                lengths: Optional[Tuple[int, int]] = None, seed: int = 0, remove_padding: bool = False,
                feeds: Optional[Dict[str, np.ndarray]] = None, kernels: bool = False,
                precision: str = "fp32") -> dict:
    """Build, check and time ``path`` against the runtimes in ``against``; returns the JSON-able result.

    ``lengths=(MIN, MAX)``: a variable-length batch (:mod:`.lengths`), padded to the longest drawn length (or to
    ``seq`` when given). ``remove_padding``: our build runs token-wise operators on valid tokens only
    (:mod:`tvm_fusion_ext.transform.padding`).

    ONNX Runtime's outputs are the reference for every ``max_abs_diff`` (computed even when ORT is not timed).
    ``torch_model`` (``minilm``/``bert-base``) names the transformers model the file was exported from when the
    file does not say so itself. ``spin``: see :func:`set_thread_spinning`. ``feeds``: the inputs to time on, by
    ONNX name (``--inputs``; a KV-cache decoder's past tensors), built for exactly their shapes. ``kernels``: also
    time each kernel of our call (:func:`~tvm_fusion_ext.deploy.profile_kernels`; the JSON's ``kernels``).
    ``precision``: what our build's dense kernels compute in (``fp32``, ``bf16``, ``int8``); ``against`` may
    also name ``ort-int8`` and ``torch-bf16`` (:mod:`.precision_peers`).
    """
    import tempfile

    from ...models import HF_KINDS, export_hf_model

    spinning = set_thread_spinning(spin)
    against = list(against)
    tgt = check_target(target)
    threads = threads_for(tgt)
    if not os.path.isfile(path):
        raise ModelLoadError(f"{path}: no such file")
    info = hf_export_info(path)
    if torch_model is not None:
        if torch_model not in HF_KINDS:
            raise InputError(f"--torch: unknown model '{torch_model}' (choose from {', '.join(HF_KINDS)})")
        info = dict(info or {}, kind=torch_model)

    if feeds is not None:
        shapes = _shapes_of(path, feeds)
        first = next(iter(shapes.values()), [])
        return _bench_loaded(path, shapes, first[0] if first else None, first[1] if len(first) > 1 else None, tgt,
                             threads, logs, against, repeat, info, stock_repeat, stock_seconds,
                             label or os.path.basename(path), spinning, out, None, seed, remove_padding, feeds,
                             kernels=kernels, precision=precision)
    with tempfile.TemporaryDirectory(prefix="tfx-bench-") as tmp:
        static = _static_dims(path)
        first = next(iter(static.values()), [])
        drawn = None
        if lengths is not None:
            drawn = draw_lengths(lengths, int(batch or (first[0] if first and first[0] else DEFAULT_BATCH)), seed)
            if seq is not None and seq < max(drawn):
                raise InputError(f"--seq {seq} is shorter than the longest drawn length {max(drawn)}")
            batch, seq = len(drawn), seq or max(drawn)
            out(f"lengths (seed {seed}): {drawn}; padded to {seq}, {sum(drawn) / (len(drawn) * seq):.0%} valid")
        # (a dynamic export serves other shapes as it is: dims 0/1 are filled below)
        wants_other_shape = info is not None and "exporter" in info and not info.get("dynamic") and (
            (seq is not None and len(first) > 1 and first[1] != seq)
            or (batch is not None and len(first) > 0 and first[0] != batch))
        if wants_other_shape:
            # our own export at another shape: export again rather than refuse (the file records how)
            out(f"re-exporting {info['kind']} at batch {batch or first[0]}, seq {seq or first[1]}")
            path = export_hf_model(info["kind"], os.path.join(tmp, "model.onnx"), exporter=info["exporter"],
                                   attn=info.get("attn", "sdpa"), seq=int(seq or first[1]),
                                   batch=int(batch or first[0]), num_layers=info.get("num_layers"),
                                   seed=int(info.get("seed", 0)), opset=info.get("opset"))
        shapes, n_batch, n_seq = _resolve_shapes(path, seq, batch)
        return _bench_loaded(path, shapes, n_batch, n_seq, tgt, threads, logs, against, repeat, info,
                             stock_repeat, stock_seconds, label or os.path.basename(path), spinning, out,
                             drawn, seed, remove_padding, kernels=kernels, precision=precision)


def _shapes_of(path: str, feeds: Dict[str, np.ndarray]) -> Dict[str, List[int]]:
    """The build shapes for ``--inputs``: every input given, each static dim as the file has it."""
    dims = _static_dims(path)
    unknown = [n for n in feeds if n not in dims]
    if unknown:
        raise InputError(f"--inputs: unknown input '{unknown[0]}' (the model takes {list(dims)})")
    missing = [n for n in dims if n not in feeds]
    if missing:
        raise InputError(f"--inputs: missing input '{missing[0]}' (the model takes {list(dims)})")
    for name, d in dims.items():
        shape = list(np.shape(feeds[name]))
        if len(shape) != len(d) or any(s is not None and s != g for s, g in zip(d, shape)):
            raise InputError(f"--inputs: input '{name}' has shape {tuple(shape)}; the model takes "
                             f"({', '.join('?' if s is None else str(s) for s in d)})")
    return {name: list(np.shape(feeds[name])) for name in dims}


def _bench_loaded(path, shapes, n_batch, n_seq, tgt, threads, logs, against, repeat, info, stock_repeat,
                  stock_seconds, label, spinning, out, drawn=None, seed=0, remove_padding=False,
                  given=None, kernels=False, precision="fp32") -> dict:
    from ...frontend import load_onnx
    from ...models import sample_inputs
    from ...runtime import CompiledModel
    from ...targets import TargetInfo

    t0 = time.perf_counter()
    mod = load_onnx(path, shapes=shapes)
    feeds = dict(given) if given is not None else sample_inputs(path, seed=0, shapes=shapes)
    if drawn is not None:
        feeds = apply_lengths(feeds, drawn, label)
    from ...compile.calibration import default_calibration

    ours = CompiledModel.from_module(mod, tgt, logs=logs, fuse=True, label=label, remove_padding=remove_padding,
                                     precision=precision, calibration=default_calibration(path, precision, shapes))
    build_s = time.perf_counter() - t0
    report = ours.report
    out(report.summary(list_expected=False))
    if logs is not None:
        out(ours.compiled.records_note)
    out(f"built with fusion + templates in {build_s:.1f} s")
    got = ours.run(feeds)

    sess = ref = None
    if importlib.util.find_spec("onnxruntime") is not None:
        sess = ort_session(path, threads, spin=spinning["thread_spinning"])
        ort_names = {i.name for i in sess.get_inputs()}
        ort_feeds = {k: v for k, v in feeds.items() if k in ort_names}  # exporters may drop unused inputs
        ref = sess.run(None, ort_feeds)

    # at valid positions only when padding is in play: what a runtime leaves at padded ones is unspecified
    mask = feeds.get(MASK_INPUT) if (drawn is not None or report.padding_removed) else None

    def diff(outputs, reference=None):
        reference = ref if reference is None else reference
        if reference is None:
            return None
        return max_abs_diff(valid_positions(outputs, mask), valid_positions(reference, mask))

    rows = [Row(OURS, max_abs_diff=diff([got[n] for n in ours.output_names]), extra={"build_seconds": build_s},
                note="" if precision == "fp32" else precision)]
    rows[0].timing = time_block(OURS, ours.bind(feeds), repeat=repeat)
    if report.padding_removed:
        # our own padded build, timed in the same run: what removing the padding gained
        padded = CompiledModel.from_module(mod, tgt, logs=logs, fuse=True, label=label)
        rows.append(Row(OURS_PADDED, time_block(OURS_PADDED, padded.bind(feeds), repeat=repeat),
                        diff([padded.run(feeds)[n] for n in padded.output_names]), note="--no-remove-padding"))
    if "ort" in against and sess is None:
        rows.append(Row(ORT, note="n/a (onnxruntime not installed)"))
    elif "ort" in against:
        rows.append(Row(ORT, time_block(ORT, lambda: sess.run(None, ort_feeds), repeat=repeat), 0.0,
                        note="reference", extra={"intra_op_threads": threads}))
    if "torch" in against:
        rows.append(torch_row(info, feeds, ref, threads, repeat, diff))
    if "ort-int8" in against:
        from .precision_peers import ort_int8_row

        rows.append(ort_int8_row(path, feeds, threads, spinning["thread_spinning"], repeat, diff))
    if "torch-bf16" in against:
        from .precision_peers import torch_bf16_row

        rows.append(torch_bf16_row(info, feeds, threads, repeat,
                                   lambda outs: diff(outs, ref[:1]) if ref is not None else None))
    if "tvm" in against:
        t1 = time.perf_counter()
        stock = stock_tvm(mod, ours, out=out)
        stock_build = time.perf_counter() - t1
        stock_diff = diff(list(stock.run(feeds).values()))
        # ~2.5 s per MiniLM call on 2 cores: a short block with a time cap
        timing = time_block(STOCK, stock.bind(feeds), warmup=1, repeat=stock_repeat, max_seconds=stock_seconds)
        rows.append(Row(STOCK, timing, stock_diff, extra={"build_seconds": stock_build}))

    ort_row = next((r for r in rows if r.name == ORT and r.timing is not None), None)
    ort_median = ort_row.timing.median if ort_row is not None else None
    out(format_table(rows))
    out("fused: " + (", ".join(f"{k} {v}" for k, v in report.fused.items()) or "nothing"))
    profile = kernel_profile(ours, feeds, repeat, out) if kernels else None
    ort_profile = (ort_kernel_profile(path, ort_feeds, threads, spinning["thread_spinning"], repeat, out)
                   if kernels and "ort" in against and sess is not None else None)
    return {
        "mode": "model",
        "model": label,
        "path": os.path.abspath(path),
        "target": TargetInfo.of(tgt).kind,
        "threads": threads,
        "batch": n_batch,
        "seq": n_seq,
        "input_shapes": {k: list(v.shape) for k, v in feeds.items()},
        "logs": logs,
        "precision": precision,
        "fused": dict(report.fused),
        "padding_removed": report.padding_removed,
        "varlen_attention": report.varlen_attention,
        "lengths": drawn,
        "lengths_seed": seed if drawn is not None else None,
        "max_abs_diff_at": "valid positions" if mask is not None else "all positions",
        "reference": ORT if ref is not None else None,
        "ratio_vs_ort": rows[0].timing.median / ort_median if ort_median else None,
        "ratio_vs_padded": next((rows[0].timing.median / r.timing.median for r in rows if r.name == OURS_PADDED),
                                None),
        "max_abs_diff_vs_ort": rows[0].max_abs_diff,
        "runtimes": [r.to_dict(ort_median) for r in rows],
        "threading": spinning,
        "environment": environment(),
        "kernels": profile,
        "ort_kernels": ort_profile,
    }


def torch_row(info, feeds, ref, threads, repeat, diff=max_abs_diff) -> Row:
    """The PyTorch eager row of a bench table for a transformers export (``info``), or why there is none."""
    if info is None or "kind" not in info:
        return Row(TORCH, note="n/a (not a transformers export)")
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        return Row(TORCH, note="n/a (torch/transformers not installed)")
    call = torch_runner(info, feeds, threads)
    torch_diff = diff([call().numpy()], ref[:1]) if ref is not None else None  # ref[:1]: torch returns one output
    timing = time_block(TORCH, call, repeat=repeat)
    return Row(TORCH, timing, torch_diff, note=f"eager, {info['kind']} attn={info.get('attn', 'sdpa')}",
               extra={"threads": threads})

