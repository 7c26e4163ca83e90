"""``tvm-fusion bench``: this package against ONNX Runtime, PyTorch eager and stock TVM, in one run.

Model mode builds the model with fusion + templates (and tuning logs), runs every runtime on the same inputs,
checks each against ONNX Runtime's outputs and times each in its own block of calls (see :mod:`.timing` for
why never call by call). Attention-only mode compares, per sequence length, our fused attention kernel,
torch's ``scaled_dot_product_attention`` and the unfused Relax graph (matmul/softmax/matmul): latency and
workspace bytes.

PyTorch eager needs the torch module, which an ONNX file does not carry. It is rebuilt from
:func:`.models.hf_model` when the file was exported by :func:`.models.export_hf_model` (which records its
arguments in the ONNX ``metadata_props`` under :data:`HF_EXPORT_KEY`), or when ``--torch minilm|bert-base``
says which model the file is; otherwise the torch row reads "n/a (not a transformers export)".
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from .errors import InputError, ModelLoadError, TargetError
from .fileio import atomic_write
from .models import HF_EXPORT_KEY
from .timing import Timing, time_block

#: ``--against`` entries, in table order (ours always comes first)
RUNTIMES = ("ort", "torch", "tvm")

OURS, ORT, TORCH, STOCK = "tvm_fusion_ext", "onnxruntime", "torch", "tvm (stock tvm.compile)"
DEFAULT_SEQ, DEFAULT_BATCH = 128, 1


@dataclass
class Row:
    """One runtime's line in the table; ``timing`` is None when the runtime could not run (``note`` says why)."""

    name: str
    timing: Optional[Timing] = None
    max_abs_diff: Optional[float] = None
    note: str = ""
    extra: dict = field(default_factory=dict)

    def to_dict(self, ort_median: Optional[float]) -> dict:
        d = {"name": self.name, "available": self.timing is not None, "max_abs_diff": self.max_abs_diff,
             "note": self.note, **self.extra}
        if self.timing is not None:
            d.update(self.timing.to_dict())
            d["name"] = self.name
            d["ratio_vs_ort"] = self.timing.median / ort_median if ort_median else None
        return d


# ---------------------------------------------------------------------------------------------------------
# argument parsing shared with the CLI
# ---------------------------------------------------------------------------------------------------------

def parse_against(text: Optional[str]) -> List[str]:
    if text is None:
        return list(RUNTIMES)
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in RUNTIMES]
    if bad or not items:
        raise InputError(f"--against: unknown runtime '{bad[0] if bad else text}' (choose from {','.join(RUNTIMES)})")
    return [r for r in RUNTIMES if r in items]


def parse_seqs(text: str) -> List[int]:
    try:
        seqs = [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise InputError(f"--seq: expected comma-separated positive integers, got '{text}'") from None
    if not seqs or any(s <= 0 for s in seqs):
        raise InputError(f"--seq: expected comma-separated positive integers, got '{text}'")
    return seqs


def _check_target(spec: str):
    import tvm

    from .targets import is_cuda, resolve_target

    target = resolve_target(spec)
    if is_cuda(target) and not tvm.cuda(0).exist:
        raise TargetError("no GPU is available: cuda runs need a GPU (use --target llvm)")
    return target


def _cores(target) -> int:
    host = target.host if target.kind.name == "cuda" and target.host is not None else target
    cores = host.attrs.get("num-cores") if host.attrs is not None else None
    return int(cores) if cores else (os.cpu_count() or 1)


def set_thread_spinning(spin: bool) -> dict:
    """By default ORT, torch (OpenMP) and TVM's thread pool keep idle workers busy-waiting between parallel
    regions. On a machine shared with other processes a descheduled spinning worker stalls every barrier
    (measured on this project's 2-core VM at load ~7: torch MiniLM-1-layer 187 ms spinning vs 3 ms passive,
    ORT MiniLM 122-159 ms vs 69-74 ms). ``spin=False`` turns it off for all three alike; it must run before
    torch and TVM's pool start their threads (environment variables set by the user win)."""
    import sys

    if not spin:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
    return {"thread_spinning": spin, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
            "TVM_THREAD_POOL_SPIN_COUNT": os.environ.get("TVM_THREAD_POOL_SPIN_COUNT"),
            "torch_imported_before": "torch" in sys.modules}


# ---------------------------------------------------------------------------------------------------------
# model mode
# ---------------------------------------------------------------------------------------------------------

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


def _torch_runner(info: dict, feeds: Dict[str, np.ndarray], threads: int) -> Callable[[], np.ndarray]:
    import torch

    from .models import hf_model

    module, _ = hf_model(info["kind"], attn=info.get("attn", "sdpa"), num_layers=info.get("num_layers"),
                         seed=int(info.get("seed", 0)))
    torch.set_num_threads(threads)
    names = ("input_ids", "attention_mask", "token_type_ids")
    shape = next(iter(feeds.values())).shape
    args = tuple(torch.from_numpy(np.ascontiguousarray(feeds[n])) if n in feeds
                 else torch.zeros(shape, dtype=torch.int64) for n in names)

    def call():
        with torch.inference_mode():
            return module(*args)

    return call


def _stock_tvm(mod, like):
    """Plain ``tvm.compile`` with TVM's own default pipeline: the baseline a TVM user starts from."""
    import tvm
    from tvm import relax

    from .runtime import CompiledModel

    ex = tvm.compile(mod, like.target, relax_pipeline=relax.get_default_pipeline(like.target))
    return CompiledModel(ex, like.target, like.input_specs, like.output_names, "stock")


def _ort_session(path: str, threads: Optional[int], spin: bool = True):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        opts.intra_op_num_threads = threads
    if not spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def _max_diff(got: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> float:
    return max(float(np.abs(np.asarray(g, dtype=np.float64) - r).max()) for g, r in zip(got, ref))


def bench_model(path: str, logs: Optional[str] = None, against: Sequence[str] = RUNTIMES,
                seq: Optional[int] = None, batch: Optional[int] = None, target: str = "llvm", repeat: int = 20,
                torch_model: Optional[str] = None, stock_repeat: int = 3, stock_seconds: float = 10.0,
                label: Optional[str] = None, spin: bool = False, out: Callable[[str], None] = print) -> dict:
    """Build, check and time ``path`` against the runtimes in ``against``; returns the JSON-able result.

    ONNX Runtime's outputs are the reference for every ``max_abs_diff`` (computed even when ORT is not timed).
    ``torch_model`` (``minilm``/``bert-base``) names the transformers model the file was exported from when the
    file does not say so itself. ``spin``: see :func:`set_thread_spinning`.
    """
    import tempfile

    from .models import HF_KINDS, export_hf_model

    spinning = set_thread_spinning(spin)
    against = list(against)
    tgt = _check_target(target)
    threads = _cores(tgt)
    if not os.path.isfile(path):
        raise ModelLoadError(f"{path}: no such file")
    info = hf_export_info(path)
    if torch_model is not None:
        if torch_model not in HF_KINDS:
            raise InputError(f"--torch: unknown model '{torch_model}' (choose from {', '.join(HF_KINDS)})")
        info = dict(info or {}, kind=torch_model)

    with tempfile.TemporaryDirectory(prefix="tfx-bench-") as tmp:
        static = _static_dims(path)
        first = next(iter(static.values()), [])
        wants_other_shape = info is not None and "exporter" in info and (
            (seq is not None and len(first) > 1 and first[1] != seq)
            or (batch is not None and len(first) > 0 and first[0] != batch))
        if wants_other_shape:
            # our own export at another shape: export again rather than refuse (the file records how)
            out(f"re-exporting {info['kind']} at batch {batch or first[0]}, seq {seq or first[1]}")
            path = export_hf_model(info["kind"], os.path.join(tmp, "model.onnx"), exporter=info["exporter"],
                                   attn=info.get("attn", "sdpa"), seq=int(seq or first[1]),
                                   batch=int(batch or first[0]), num_layers=info.get("num_layers"),
                                   seed=int(info.get("seed", 0)))
        shapes, n_batch, n_seq = _resolve_shapes(path, seq, batch)
        return _bench_loaded(path, shapes, n_batch, n_seq, tgt, threads, logs, against, repeat, info,
                             stock_repeat, stock_seconds, label or os.path.basename(path), spinning, out)


def _bench_loaded(path, shapes, n_batch, n_seq, tgt, threads, logs, against, repeat, info, stock_repeat,
                  stock_seconds, label, spinning, out) -> dict:
    from .api import fuse
    from .frontend import load_onnx
    from .models import sample_inputs
    from .runtime import CompiledModel

    t0 = time.perf_counter()
    mod = load_onnx(path, shapes=shapes)
    _, report = fuse(mod)
    out(report.summary())
    feeds = sample_inputs(path, seed=0, shapes=shapes)
    ours = CompiledModel.from_module(mod, tgt, logs=logs, fuse=True, label=label)
    build_s = time.perf_counter() - t0
    out(f"built with fusion + templates in {build_s:.1f} s")
    got = ours.run(feeds)

    sess = ref = None
    if importlib.util.find_spec("onnxruntime") is not None:
        sess = _ort_session(path, threads, spin=spinning["thread_spinning"])
        ort_names = {i.name for i in sess.get_inputs()}
        ort_feeds = {k: v for k, v in feeds.items() if k in ort_names}  # exporters may drop unused inputs
        ref = sess.run(None, ort_feeds)

    def diff(outputs):
        return _max_diff(outputs, ref) if ref is not None else None

    rows = [Row(OURS, max_abs_diff=diff([got[n] for n in ours.output_names]), extra={"build_seconds": build_s})]
    rows[0].timing = time_block(OURS, ours.bind(feeds), repeat=repeat)
    if "ort" in against and sess is None:
        rows.append(Row(ORT, note="n/a (onnxruntime not installed)"))
    elif "ort" in against:
        rows.append(Row(ORT, time_block(ORT, lambda: sess.run(None, ort_feeds), repeat=repeat), 0.0,
                        note="reference", extra={"intra_op_threads": threads}))
    if "torch" in against:
        rows.append(_torch_row(info, feeds, ref, threads, repeat))
    if "tvm" in against:
        t1 = time.perf_counter()
        stock = _stock_tvm(mod, ours)
        stock_build = time.perf_counter() - t1
        stock_diff = diff(list(stock.run(feeds).values()))
        # ~2.5 s per MiniLM call on 2 cores: a short block with a time cap
        timing = time_block(STOCK, stock.bind(feeds), warmup=1, repeat=stock_repeat, max_seconds=stock_seconds)
        rows.append(Row(STOCK, timing, stock_diff, extra={"build_seconds": stock_build}))

    ort_row = next((r for r in rows if r.name == ORT and r.timing is not None), None)
    ort_median = ort_row.timing.median if ort_row is not None else None
    out(format_table(rows))
    out("fused: " + (", ".join(f"{k} {v}" for k, v in report.fused.items()) or "nothing"))
    return {
        "mode": "model",
        "model": label,
        "path": os.path.abspath(path),
        "target": str(tgt.kind.name),
        "threads": threads,
        "batch": n_batch,
        "seq": n_seq,
        "input_shapes": {k: list(v.shape) for k, v in feeds.items()},
        "logs": logs,
        "fused": dict(report.fused),
        "reference": ORT if ref is not None else None,
        "ratio_vs_ort": rows[0].timing.median / ort_median if ort_median else None,
        "max_abs_diff_vs_ort": rows[0].max_abs_diff,
        "runtimes": [r.to_dict(ort_median) for r in rows],
        "threading": spinning,
        "environment": _environment(),
    }


def _torch_row(info, feeds, ref, threads, repeat) -> Row:
    if info is None or "kind" not in info:
        return Row(TORCH, note="n/a (not a transformers export)")
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        return Row(TORCH, note="n/a (torch/transformers not installed)")
    call = _torch_runner(info, feeds, threads)
    diff = _max_diff([call().numpy()], ref[:1]) if ref is not None else None
    timing = time_block(TORCH, call, repeat=repeat)
    return Row(TORCH, timing, diff, note=f"eager, {info['kind']} attn={info.get('attn', 'sdpa')}",
               extra={"threads": threads})


def _environment() -> dict:
    import importlib.metadata as md

    env = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    for pkg in ("apache-tvm", "onnxruntime", "torch", "transformers"):
        try:
            env[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return env


def format_table(rows: Sequence) -> str:
    """Latency table; accepts :class:`Row` or bare :class:`Timing` items."""
    rows = [r if isinstance(r, Row) else Row(r.name, r) for r in rows]
    ort = next((r.timing for r in rows if r.name == ORT and r.timing is not None), None)
    lines = [f"{'runtime':<26}{'median ms':>11}{'p10':>9}{'p90':>9}{'vs ORT':>9}{'max|diff|':>11}"]
    for r in rows:
        diff = f"{r.max_abs_diff:.2e}" if r.max_abs_diff is not None else "-"
        if r.timing is None:
            lines.append(f"{r.name:<26}  {r.note}")
            continue
        t = r.timing
        ratio = f"{t.median / ort.median:.2f}x" if ort else "-"
        lines.append(f"{r.name:<26}{t.median:>11.3f}{t.p10:>9.3f}{t.p90:>9.3f}{ratio:>9}{diff:>11}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# attention-only mode
# ---------------------------------------------------------------------------------------------------------

def _attention_modules(heads: int, seq: int, head_dim: int):
    """(fused, unfused) Relax modules ``main(q, k, v)`` on (1, H, S, D) fp32."""
    from tvm import relax

    from .ops import call_op

    shape = [1, heads, seq, head_dim]
    scale = float(1.0 / np.sqrt(head_dim))

    def make(body):
        bb = relax.BlockBuilder()
        q, k, v = (relax.Var(n, relax.TensorType(shape, "float32")) for n in "qkv")
        with bb.function("main", [q, k, v]):
            with bb.dataflow():
                res = bb.emit_output(body(bb, q, k, v))
            bb.emit_func_output(res)
        return bb.get()

    def fused(bb, q, k, v):
        return bb.emit(call_op(bb, "fused_attention", {"q": q, "k": k, "v": v},
                               {"scale": scale, "causal": False, "q_layout": "BHSD", "k_layout": "BHSD",
                                "v_layout": "BHSD", "out_layout": "BHSD"}))

    def unfused(bb, q, k, v):
        s = bb.emit(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2])))
        s = bb.emit(relax.op.multiply(s, relax.const(scale, "float32")))
        p = bb.emit(relax.op.nn.softmax(s, axis=-1))
        return bb.emit(relax.op.matmul(p, v))

    return make(fused), make(unfused)


def _tir_allocations(func) -> List[int]:
    """Bytes of every buffer a PrimFunc allocates once lowered to flat buffers (parameters are not counted)."""
    import tvm
    import tvm_ffi
    from tvm import s_tir, tirx

    passes = [s_tir.transform.LowerInitBlock(), s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
              s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.CompactBufferAllocation(),
              s_tir.transform.LowerOpaqueBlock(), tirx.transform.FlattenBuffer()]
    lowered = tvm.ir.transform.Sequential(passes)(tvm.IRModule({"main": func}))["main"]
    sizes: List[int] = []

    def visit(node):
        buf = node.buffer
        dtype = tvm.DataType(str(buf.dtype))
        elems = int(np.prod([int(x) for x in buf.shape])) if len(buf.shape) else 1
        sizes.append(elems * dtype.bits * dtype.lanes // 8)
        return node

    tvm_ffi.structural_map(lowered.body, (tirx.AllocBuffer, visit))
    return sizes


def workspace_bytes(mod, target) -> Dict[str, int]:
    """Bytes allocated besides the inputs and the output, in the module ``build`` compiles: Relax-level
    intermediates between kernels (``tensor``) plus what each scheduled, lowered PrimFunc allocates (``tir``).
    A sum, so an upper bound on the peak (the VM's memory planner may reuse storage)."""
    import tvm
    from tvm import relax

    from .build import lower, schedule

    scheduled = schedule(lower(mod, target), target)
    tir = sum(sum(_tir_allocations(f)) for _, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc))
    main = scheduled["main"]
    tensor = 0
    for block in main.body.blocks:
        for binding in block.bindings:
            ty = binding.var.ty
            if isinstance(binding.var, relax.DataflowVar) and isinstance(ty, relax.TensorType) and ty.shape is not None:
                dtype = tvm.DataType(str(ty.dtype))
                tensor += int(np.prod([int(d) for d in ty.shape.values])) * dtype.bits // 8
    return {"total": tir + tensor, "tir": tir, "tensor": tensor}


def _attention_repeat(seq: int, repeat: Optional[int]) -> int:
    if repeat is not None:
        return repeat
    return 10 if seq <= 512 else 5 if seq <= 1024 else 3


def bench_attention(seqs: Sequence[int], heads: int = 12, head_dim: int = 64, repeat: Optional[int] = None,
                    max_seconds: float = 10.0, spin: bool = False, out: Callable[[str], None] = print) -> dict:
    """Per sequence length: ours (fused kernel, our CPU template), torch SDPA and the unfused Relax graph."""
    spinning = set_thread_spinning(spin)
    import tvm
    from tvm import relax

    from .build import build
    from .targets import resolve_target

    target = resolve_target("llvm")
    threads = _cores(target)
    have_torch = importlib.util.find_spec("torch") is not None
    results = []
    for seq in seqs:
        n = _attention_repeat(seq, repeat)
        rng = np.random.default_rng(seq)
        q, k, v = (rng.standard_normal((1, heads, seq, head_dim)).astype("float32") for _ in range(3))
        ref = _attention_reference(q, k, v)
        fused_mod, unfused_mod = _attention_modules(heads, seq, head_dim)
        score_bytes = heads * seq * seq * 4
        entry = {"seq": seq, "heads": heads, "head_dim": head_dim, "batch": 1, "score_matrix_bytes": score_bytes,
                 "runtimes": []}
        for name, mod in ((OURS, fused_mod), ("unfused relax", unfused_mod)):
            ws = workspace_bytes(mod, target)
            vm = relax.VirtualMachine(build(mod, target, fuse=False), tvm.cpu())
            args = [tvm.runtime.tensor(a) for a in (q, k, v)]
            diff = float(np.abs(vm["main"](*args).numpy() - ref).max())
            timing = time_block(name, lambda: vm["main"](*args), warmup=1, repeat=n, max_seconds=max_seconds)
            entry["runtimes"].append({**timing.to_dict(), "workspace_bytes": ws["total"], "workspace": ws,
                                      "max_abs_diff": diff})
        if have_torch:
            entry["runtimes"].append(_torch_attention(q, k, v, ref, threads, n, max_seconds))
        else:
            entry["runtimes"].append({"name": "torch sdpa", "available": False, "note": "n/a (torch not installed)",
                                      "workspace_bytes": None})
        results.append(entry)
        out(format_attention(entry))
    return {"mode": "attention", "target": "llvm", "threads": threads, "heads": heads, "head_dim": head_dim,
            "dtype": "float32", "seqs": list(seqs), "results": results, "threading": spinning,
            "workspace_definition": "bytes allocated besides q, k, v and the output: Relax intermediates + "
                                    "allocations in the scheduled, lowered TIR (sum, an upper bound on peak); "
                                    "torch: not measured",
            "environment": _environment()}


def bench_dense(shape: str, act: str = "gelu", repeat: int = 50, spin: bool = False,
                out: Callable[[str], None] = print) -> dict:
    """``fused_dense`` alone (constant weight, so the build pre-packs it; bias + activation epilogue) at
    ``shape`` = "MxKxN": median latency and GFLOP/s with this build path's default knobs, checked vs numpy."""
    spinning = set_thread_spinning(spin)
    import tvm
    from tvm import relax

    from .build import build
    from .ops import call_op
    from .ops.dense import ACTIVATIONS
    from .targets import resolve_target
    from .testing import numpy_activation

    try:
        m, k, n = (int(d) for d in shape.lower().split("x"))
        if min(m, k, n) <= 0:
            raise ValueError
    except ValueError:
        raise InputError(f"--dense takes MxKxN with positive sizes, e.g. 128x384x1536 (got '{shape}')") from None
    if act not in ACTIVATIONS:
        raise InputError(f"unknown activation '{act}' (known: {', '.join(ACTIVATIONS)})")
    target = resolve_target("llvm")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype("float32")
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype("float32")
    b = rng.standard_normal(n).astype("float32")
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType((m, k), "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit_output(call_op(bb, "fused_dense", {"x": xv, "w": relax.const(w), "bias": relax.const(b)},
                                       {"act": act, "transpose_b": False}))
        bb.emit_func_output(y)
    vm = relax.VirtualMachine(build(bb.get(), target, fuse=False), tvm.cpu())
    xt = tvm.runtime.tensor(x)
    diff = float(np.abs(vm["main"](xt).numpy() - numpy_activation(x.astype(np.float64) @ w + b, act)).max())
    timing = time_block(OURS, lambda: vm["main"](xt), warmup=20, repeat=repeat)  # thread pool warm
    gflops = 2.0 * m * k * n / (timing.median * 1e-3) / 1e9
    out(f"fused_dense {m}x{k}x{n} (+bias, {act}), {_cores(target)} threads: median {timing.median:.3f} ms "
        f"(p10 {timing.p10:.3f}, p90 {timing.p90:.3f}) = {gflops:.1f} GFLOP/s; max |ours - numpy| {diff:.1e}")
    return {"mode": "dense", "shape": [m, k, n], "act": act, "threads": _cores(target), **timing.to_dict(),
            "gflops": gflops, "max_abs_diff": diff, "threading": spinning, "environment": _environment()}


def _attention_reference(q, k, v) -> np.ndarray:
    s = (q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2)) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)


def _torch_attention(q, k, v, ref, threads, repeat, max_seconds) -> dict:
    import torch

    torch.set_num_threads(threads)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))

    def call():
        with torch.inference_mode():
            return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)

    diff = float(np.abs(call().numpy() - ref).max())
    timing = time_block("torch sdpa", call, warmup=1, repeat=repeat, max_seconds=max_seconds)
    # torch's CPU SDPA picks its own kernel (a flash-style one for fp32 when it can); its scratch memory is
    # not observable from here, so we do not guess it
    return {**timing.to_dict(), "workspace_bytes": None, "max_abs_diff": diff,
            "note": "workspace not measured (torch CPU SDPA's internal buffers are not observable)"}


def format_attention(entry: dict) -> str:
    lines = [f"-- attention B=1 H={entry['heads']} S={entry['seq']} D={entry['head_dim']} fp32 "
             f"(S×S scores would be {_mib(entry['score_matrix_bytes'])})",
             f"{'runtime':<18}{'median ms':>11}{'p10':>9}{'p90':>9}{'workspace':>13}{'max|diff|':>11}"]
    for r in entry["runtimes"]:
        if "median_ms" not in r:
            lines.append(f"{r['name']:<18}  {r.get('note', 'n/a')}")
            continue
        ws = _mib(r["workspace_bytes"]) if r.get("workspace_bytes") is not None else "n/a"
        lines.append(f"{r['name']:<18}{r['median_ms']:>11.3f}{r['p10_ms']:>9.3f}{r['p90_ms']:>9.3f}{ws:>13}"
                     f"{r['max_abs_diff']:>11.2e}")
    return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**16 else f"{n / 2**10:.1f} KiB"


# ---------------------------------------------------------------------------------------------------------
# output files
# ---------------------------------------------------------------------------------------------------------

def write_json(path: str, result: dict) -> None:
    atomic_write(path, lambda f: json.dump(result, f, indent=2, default=_jsonable))


def _jsonable(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    return str(x)


def plot(path: str, result: dict) -> None:
    """Bar chart: median latency per runtime (model mode) or per runtime and sequence length (attention)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if result["mode"] == "attention":
        fig, (ax, ax_ws) = plt.subplots(1, 2, figsize=(12, 4))
    else:
        fig, ax = plt.subplots(figsize=(7, 4))
    if result["mode"] == "model":
        rows = [r for r in result["runtimes"] if r.get("median_ms") is not None]
        names = [r["name"] for r in rows]
        med = [r["median_ms"] for r in rows]
        err = [[r["median_ms"] - r["p10_ms"] for r in rows], [r["p90_ms"] - r["median_ms"] for r in rows]]
        ax.bar(names, med, yerr=err, capsize=4, color="tab:blue")
        ax.set_yscale("log")
        ax.set_title(f"{result['model']} (batch {result['batch']}, seq {result['seq']})")
    else:
        seqs = [e["seq"] for e in result["results"]]
        names = [r["name"] for r in result["results"][0]["runtimes"] if "median_ms" in r]
        width = 0.8 / max(len(names), 1)
        for i, name in enumerate(names):
            med = [next((r["median_ms"] for r in e["runtimes"] if r["name"] == name and "median_ms" in r), 0.0)
                   for e in result["results"]]
            ax.bar([j + i * width for j in range(len(seqs))], med, width, label=name)
        ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(seqs))], [str(s) for s in seqs])
        ax.set_xlabel("sequence length")
        ax.legend()
        ax.set_title(f"attention latency, H={result['heads']} D={result['head_dim']} fp32")
        for name in names:
            ws = [next((r.get("workspace_bytes") for r in e["runtimes"] if r["name"] == name), None)
                  for e in result["results"]]
            if all(w is not None for w in ws):  # torch's is not measured
                ax_ws.plot(seqs, [w / 2**20 for w in ws], marker="o", label=name)
        ax_ws.set_xscale("log", base=2)
        ax_ws.set_yscale("log")
        ax_ws.set_xlabel("sequence length")
        ax_ws.set_ylabel("workspace (MiB)")
        ax_ws.set_title("workspace besides inputs and output")
        ax_ws.legend()
    ax.set_ylabel("median latency (ms)")
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png"), binary=True)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------
# command
# ---------------------------------------------------------------------------------------------------------

def run_bench(args, out: Callable[[str], None] = print) -> dict:
    """What ``tvm-fusion bench`` does with its parsed arguments (validation first: bad flags fail fast)."""
    if args.dense:
        if args.model is not None or args.attention_only or args.plot:
            raise InputError("--dense takes no model file, --attention-only or --plot")
        result = bench_dense(args.dense, act=args.act, repeat=args.repeat or 50, spin=args.spin, out=out)
    elif args.attention_only:
        if args.model is not None:
            raise InputError("--attention-only takes no model file")
        seqs = parse_seqs(args.seq or "512,1024,2048")
        if args.heads <= 0 or args.head_dim <= 0:
            raise InputError("--heads and --head-dim must be positive")
        result = bench_attention(seqs, heads=args.heads, head_dim=args.head_dim, repeat=args.repeat,
                                 spin=args.spin, out=out)
    else:
        if args.model is None:
            raise InputError("bench needs a MODEL.onnx (or --attention-only)")
        against = parse_against(args.against)
        seq = parse_seqs(args.seq)[0] if args.seq else None
        if args.seq and len(parse_seqs(args.seq)) > 1:
            raise InputError("--seq takes one length in model mode")
        if args.batch is not None and args.batch <= 0:
            raise InputError("--batch must be positive")
        if args.repeat is not None and args.repeat <= 0:
            raise InputError("--repeat must be positive")
        result = bench_model(args.model, logs=args.logs, against=against, seq=seq, batch=args.batch,
                             target=args.target, repeat=args.repeat or 20, torch_model=args.torch, spin=args.spin,
                             out=out)
    if args.json:
        write_json(args.json, result)
        out(f"wrote {args.json}")
    if args.plot:
        plot(args.plot, result)
        out(f"wrote {args.plot}")
    return result


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="time this package against ONNX Runtime, torch and stock TVM "
                                     "(or attention kernels alone)")
    p.add_argument("model", nargs="?", help="ONNX model file (not with --attention-only)")
    p.add_argument("--logs", help="tuning-log directory to apply to this package's build")
    p.add_argument("--against", help=f"comma-separated runtimes to compare with (default {','.join(RUNTIMES)})")
    p.add_argument("--seq", help=f"sequence length for dynamic dims / our exports (default: the model's, or "
                                 f"{DEFAULT_SEQ}); with --attention-only a list, e.g. 512,1024,2048")
    p.add_argument("--batch", type=int, help=f"batch size for dynamic dims / our exports (default: the model's, "
                                             f"or {DEFAULT_BATCH})")
    p.add_argument("--target", default="llvm", help="llvm (default) or cuda (needs a GPU)")
    p.add_argument("--repeat", type=int, help="timed runs per runtime (default 20; attention: 10/5/3 by length; "
                                              "stock TVM: 3, capped at 10 s)")
    p.add_argument("--torch", choices=["minilm", "bert-base"],
                   help="the transformers model the ONNX file was exported from, when the file does not record "
                        "it (exports by tvm_fusion_ext.models.export_hf_model do)")
    p.add_argument("--spin", action="store_true",
                   help="let ORT, torch and TVM worker threads busy-wait between parallel regions (their defaults: "
                        "fastest on an idle machine, much slower on a shared one; off by default, for all alike)")
    p.add_argument("--json", help="write all results to this JSON file")
    p.add_argument("--plot", help="write a bar chart (PNG) to this file")
    p.add_argument("--attention-only", action="store_true",
                   help="benchmark the attention kernel alone: ours vs torch SDPA vs unfused Relax")
    p.add_argument("--dense", metavar="MxKxN", help="benchmark fused_dense alone at this shape (GFLOP/s)")
    p.add_argument("--act", default="gelu", help="--dense: epilogue activation (default gelu)")
    p.add_argument("--heads", type=int, default=12, help="attention-only: heads (default 12)")
    p.add_argument("--head-dim", type=int, default=64, help="attention-only: head dim (default 64)")
    p.set_defaults(func=run_bench_command)


def run_bench_command(args) -> int:
    run_bench(args)
    return 0
