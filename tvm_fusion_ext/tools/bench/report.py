"""How bench results are shown and saved: the latency tables, JSON and a bar chart."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from ...fileio import atomic_write
from ..timing import Timing

#: ``--against`` entries, in table order (ours always comes first)
RUNTIMES = ("ort", "torch", "tvm")
OURS, ORT, TORCH, STOCK = "tvm_fusion_ext", "onnxruntime", "torch", "tvm (stock tvm.compile)"
OURS_PADDED = "tvm_fusion_ext (padded)"  # with --remove-padding: our own padded build, same run


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


def format_attention(entry: dict) -> str:
    lines = [f"-- attention B=1 H={entry['heads']} S={entry['seq']} D={entry['head_dim']} fp32 "
             f"(S×S scores would be {mib(entry['score_matrix_bytes'])})",
             f"{'runtime':<18}{'median ms':>11}{'p10':>9}{'p90':>9}{'workspace':>13}{'max|diff|':>11}"]
    for r in entry["runtimes"]:
        if "median_ms" not in r:
            lines.append(f"{r['name']:<18}  {r.get('note', 'n/a')}")
            continue
        ws = mib(r["workspace_bytes"]) if r.get("workspace_bytes") is not None else "n/a"
        lines.append(f"{r['name']:<18}{r['median_ms']:>11.3f}{r['p10_ms']:>9.3f}{r['p90_ms']:>9.3f}{ws:>13}"
                     f"{r['max_abs_diff']:>11.2e}")
    return "\n".join(lines)


def mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**16 else f"{n / 2**10:.1f} KiB"


def write_json(path: str, result: dict) -> None:
    atomic_write(path, lambda f: json.dump(result, f, indent=2, default=_jsonable))


def _jsonable(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    return str(x)


#: a runtime slower than this many times the fastest one is drawn clipped at the top, its figure written on it
#: (stock TVM is ~100x slower than the rest: on a shared linear axis it would flatten every other bar)
OFF_SCALE_RATIO = 4.0


def plot_title(result: dict, what: str) -> str:
    """``what``, then the host and date the figures were measured on (a figure means nothing without them)."""
    env = result.get("environment") or {}
    host = env.get("cpu") or env.get("machine") or "unknown host"
    cores = f", {env['cpus']} cores" if env.get("cpus") else ""
    date = f", {env['date']}" if env.get("date") else ""
    return f"{what}\n{host}{cores}{date}"


def plot(path: str, result: dict) -> None:
    """:func:`figure` of ``result``, written to ``path`` as a PNG."""
    import matplotlib.pyplot as plt

    fig = figure(result)
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110), binary=True)
    plt.close(fig)


def figure(result: dict):
    """Bar chart of median latency, on a linear axis from zero (the bars' heights compare as the times do): per
    runtime, each bar labelled with its ms and its ratio to ONNX Runtime (model or artifact mode), or per runtime
    and sequence length (attention mode, beside its workspace). The title names the host and the date."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    if result["mode"] == "attention":
        fig, (ax, ax_ws) = plt.subplots(1, 2, figsize=(12, 4.5))
    else:
        fig, ax = plt.subplots(figsize=(8, 4.5))
    if result["mode"] != "attention":  # a model or an artifact
        _runtime_bars(ax, [r for r in result["runtimes"] if r.get("median_ms") is not None])
        ax.set_title(plot_title(result, f"{result['model']} (batch {result['batch']}, seq {result['seq']})"))
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
        ax.set_ylim(bottom=0)
        ax.legend()
        ax.set_title(plot_title(result, f"attention latency, H={result['heads']} D={result['head_dim']} fp32"))
        for name in names:
            ws = [next((r.get("workspace_bytes") for r in e["runtimes"] if r["name"] == name), None)
                  for e in result["results"]]
            if all(w is not None for w in ws):  # torch's is not measured
                ax_ws.plot(seqs, [w / 2**20 for w in ws], marker="o", label=name)
        # log-log on purpose: the point is O(S) against O(S^2); plain numbers on the ticks
        ax_ws.set_xscale("log", base=2)
        ax_ws.set_yscale("log")
        ax_ws.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax_ws.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax_ws.set_xlabel("sequence length")
        ax_ws.set_ylabel("workspace (MiB, log scale)")
        ax_ws.set_title("workspace besides inputs and output")
        ax_ws.legend()
    ax.set_ylabel("median latency (ms)")
    fig.tight_layout()
    return fig


def _runtime_bars(ax, rows: Sequence[dict]) -> None:
    """One bar per runtime, linear from 0, p10-p90 whiskers; runtimes far slower than the fastest are clipped."""
    names = [r["name"] for r in rows]
    med = [r["median_ms"] for r in rows]
    ort = next((r["median_ms"] for r in rows if r["name"] == ORT), None)
    fastest = min(med) if med else 1.0
    on_scale = [m for m in med if m <= OFF_SCALE_RATIO * fastest]
    top = max(max(r["p90_ms"] for r in rows if r["median_ms"] in on_scale), max(on_scale)) * 1.25 if on_scale else 1
    for m in sorted(med):  # a runtime just past the whiskers is drawn whole: clipping is for the far-off ones
        if top < m <= 2 * top:
            top = m * 1.15
    shown = [min(m, top) for m in med]
    colors = ["tab:blue" if n.startswith(OURS) else "tab:gray" for n in names]
    nan = float("nan")  # no whisker on a clipped bar
    lo = [max(0.0, m - r["p10_ms"]) if m <= top else nan for m, r in zip(med, rows)]
    hi = [max(0.0, min(r["p90_ms"], top) - m) if m <= top else nan for m, r in zip(med, rows)]
    ax.bar(range(len(rows)), shown, yerr=[lo, hi], capsize=4, color=colors)
    ax.set_xticks(range(len(rows)), [n.replace(" (", "\n(") for n in names])
    ax.set_ylim(0, top * 1.15)  # headroom for the labels above the tallest whiskers
    for i, (m, s, r) in enumerate(zip(med, shown, rows)):
        label = f"{m:.3g} ms" if m < 100 else f"{m:.0f} ms"
        if ort:
            label += f"\n{m / ort:.2f}x ORT"
        if m > top:  # written inside the clipped bar
            ax.text(i, top / 2, label + "\n(off scale)", ha="center", va="center", fontsize=9, color="white")
        else:  # above the p90 whisker
            ax.text(i, min(r["p90_ms"], top) + 0.015 * top, label, ha="center", va="bottom", fontsize=9)


def kernel_profile(model, feeds, runs: int, out) -> dict:
    """``--kernels``: each kernel of ``model``'s call on ``feeds`` timed inside the VM, printed as a table with
    each dense kernel's share of the host's peak for the precision it computes in (measured now,
    :mod:`.host_peaks`); the JSON-able profile (:func:`~tvm_fusion_ext.deploy.profile_kernels`) with ``peaks``."""
    import tvm_ffi

    from ...deploy.profile import profile_kernels
    from .host_peaks import describe_peaks, measure_peaks, peak_for

    profile = profile_kernels(model, feeds, runs=runs)
    peaks = measure_peaks(int(tvm_ffi.get_global_func("runtime.NumThreads")()))
    precision = model_precision(model)
    out("where our call's time goes (each kernel timed inside the VM):")
    out(profile.table(peak=lambda name: peak_for(peaks, "int8" if "int8" in name else precision)))
    out(describe_peaks(peaks))
    result = profile.to_dict()
    result["peaks"] = peaks
    result["precision"] = precision
    return result


def model_precision(model) -> str:
    """The precision of a CompiledModel or a loaded artifact's dense kernels (fp32 when it does not say)."""
    precision = getattr(model, "precision", None)
    if isinstance(precision, str):
        return precision
    manifest = getattr(model, "manifest", None) or {}
    return str((manifest.get("precision") or {}).get("precision", "fp32"))


def ort_kernel_profile(path: str, feeds, threads, spin: bool, runs: int, out) -> dict:
    """``--kernels`` with ONNX Runtime in the run: its call split per operator type by its own profiler, printed
    after ours (:mod:`.ort_profile`); the JSON-able profile."""
    from .ort_profile import profile_ort

    try:
        profile = profile_ort(path, feeds, threads, spin, runs=runs)
    except (OSError, ValueError, KeyError, TypeError) as e:
        # a diagnostic: the timed comparison above stands without it
        out(f"ONNX Runtime's profile not available: {e}")
        return {"error": str(e)}
    out("where ONNX Runtime's call goes (its own profiler, per operator type):")
    out(profile.table())
    return profile.to_dict()
