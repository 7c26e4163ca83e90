"""The one entry point of compilation: fuse → lower → schedule → finalize.

Everything that compiles (``build``, the tuner, ``bench``, ``inspect-cuda``, ``tvm-fusion compile``) goes through
:func:`compile_model` (or, for the tuner, its first two steps :func:`prepare`), so the graph the tuner saw is
the graph the build schedules, and fusion runs once per compilation, with its report kept.

The target is resolved here, once, at the entry points (:func:`compile_model`, :func:`build`, :func:`prepare`);
the steps below take the resolved :class:`tvm.target.Target`. The template rules (with the compilation's knobs
and the knobs transferred from records) are built once too, and the same list serves lowering (operator
parameters) and scheduling.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import tvm

from ..targets import TargetInfo, TargetSpec, resolve_target, resolved_target
from ..transform.report import FusionReport
from .finalize import finalize
from .lower import lower
from .schedule import schedule

logger = logging.getLogger(__name__)


@dataclass
class Compiled:
    """What one compilation produced."""

    executable: object                       # tvm.compile's Executable
    target: tvm.target.Target
    report: Optional[FusionReport]           # None when compiled without fusion
    records: Optional[str] = None            # the record directory applied, if any
    records_note: str = ""                   # which records were used, or why none
    #: with ``lift_weights``: ``[(parameter name, value)]`` to pass after the inputs, in parameter order
    weights: List[Tuple[str, object]] = field(default_factory=list)
    #: tuned knobs that reached kernels no record matched (``KernelKnobs.applied``): rule, signature, knobs, from
    transferred: List[dict] = field(default_factory=list)
    #: records under ``logs`` whose knobs could not transfer: ``{"not_transferred": N, "..._reasons": {...}}``
    transfer_refusals: dict = field(default_factory=dict)
    logs: Optional[str] = None               # the ``logs`` given (a record directory or a root of them)
    #: the precision the dense kernels compute in, what it changed, its measured accuracy (compile/precision.py)
    precision: Optional[object] = None       # PrecisionReport
    #: how the KV cache is kept: ``concat`` (as exported) or ``inplace`` (compile/kv_cache.py), with its capacity
    kv_cache: Optional[object] = None        # KVCacheReport

    @property
    def precision_name(self) -> str:
        return self.precision.precision if self.precision is not None else "fp32"


def fuse(mod: tvm.IRModule, remove_padding: bool = False) -> Tuple[tvm.IRModule, FusionReport]:
    """:func:`~tvm_fusion_ext.transform.SemanticFusion` with its report: ``(fused module, FusionReport)``."""
    from ..transform.pipeline import SemanticFusion

    with FusionReport.collect() as report:
        fused = SemanticFusion(remove_padding=remove_padding)(mod)
    return fused, report


def prepare(mod: tvm.IRModule, target: TargetSpec = None, fuse_graph: bool = True, remove_padding: bool = False,
            knobs: Optional[dict] = None, kernel_knobs=None,
            templates: Optional[list] = None, precision: str = "fp32",
            kv_cache: str = "concat") -> Tuple[tvm.IRModule, Optional[FusionReport]]:
    """Fuse (optionally; ``remove_padding`` as in :func:`SemanticFusion`), set the dense kernels' ``precision``
    (:mod:`.precision`; the FusionReport's ``precision``) and lower: the unscheduled module every later step
    starts from (``knobs`` / ``kernel_knobs`` / ``templates``: as the build will schedule, see :func:`lower`;
    ``kv_cache``: as :func:`compile_model`)."""
    lowered, report, _, _ = _prepare(mod, target, fuse_graph, remove_padding, knobs, kernel_knobs, precision,
                                     templates, kv_cache=kv_cache)
    return lowered, report


def _prepare(mod, target, fuse_graph, remove_padding, knobs, kernel_knobs, precision, templates=None,
             calibration=None, kv_cache="concat"):
    """:func:`prepare`, also returning the PrecisionReport (which exists without fusion too) and the
    KVCacheReport."""
    from .kv_cache import apply_kv_cache, check_kv_cache, drop_crops_within_capacity
    from .precision import apply_precision

    target = resolved_target(target)
    report = None
    if check_kv_cache(kv_cache) != "concat" and not fuse_graph:
        from ..errors import InputError

        raise InputError("kv_cache=inplace rewrites the fused attention's cache: it needs fusion (drop --no-fusion)")
    if fuse_graph:
        mod, report = fuse(drop_crops_within_capacity(mod, kv_cache), remove_padding)
    mod, kv_report = apply_kv_cache(mod, kv_cache)
    mod, precision_report = apply_precision(mod, precision, target, calibration)
    if report is not None:
        report.precision = precision_report
    return lower(mod, target, knobs, kernel_knobs, templates=templates), report, precision_report, kv_report


def select_records(logs: Optional[str], mod: tvm.IRModule, target: tvm.target.Target,
                   precision: str = "fp32") -> Tuple[Optional[str], str]:
    """The record directory under ``logs`` for ``mod`` on ``target`` in ``precision`` (see
    :func:`~tvm_fusion_ext.records.select`)."""
    if logs is None:
        return None, "no tuning records given; template default knobs"
    from ..records import select

    return select(logs, mod, target, precision)


def compile_model(mod: tvm.IRModule, target: TargetSpec = None, logs: Optional[str] = None, fuse_graph: bool = True,
                  knobs: Optional[dict] = None, lift_weights: bool = False, remove_padding: bool = False,
                  precision: str = "fp32", calibration=None, kv_cache: str = "concat") -> Compiled:
    """Fuse, lower, schedule (records from ``logs``, templates, fallback) and build ``mod`` for ``target``.

    ``logs`` is a record directory or a root of them (the one whose manifest matches this model and target is
    used; none matching builds untuned, and :attr:`Compiled.records_note` says so). Kernels no record matches
    (a symbolic build's, always) take the template knobs of template-space records of the same signature under
    ``logs`` for this target (:mod:`.record_knobs`; :attr:`Compiled.transferred`). ``knobs`` maps a block
    rule (``"tfx.dense"``) to template knobs, for kernels neither covers. ``lift_weights``: the scheduled
    module's large constants become trailing parameters of ``main`` (:attr:`Compiled.weights`), so that an
    artifact can store them beside the library (:mod:`.codegen.weights`). ``precision``: ``fp32`` (default),
    ``bf16`` or ``int8`` for the constant-weight dense kernels (:mod:`.precision`; :attr:`Compiled.precision`).
    ``calibration``: sample input dicts (by ONNX input name) from which int8 calibrates its activation smoothing
    (:mod:`.calibration`); without them int8 quantises activations unsmoothed, less accurately. ``kv_cache``:
    ``concat`` (default: the cache as exported, past and new concatenated into ``present``) or ``inplace``: past
    inputs become buffers of the past dim's upper bound, written in place at the new input ``past_length``
    (:mod:`.kv_cache`; :attr:`Compiled.kv_cache`)."""
    from ..schedules.registry import template_rules
    from .precision import check_precision

    precision = check_precision(precision)
    target = resolve_target(target)
    records, note = select_records(logs, mod, target, precision)
    transfer = None
    if logs is not None:
        from .record_knobs import collect

        transfer = collect(logs, target)
    table = transfer.table if transfer is not None else None
    templates = template_rules(target, knobs, table)  # here: a bad knob is a one-line error, not a TVM one
    lowered, report, precision_report, kv_report = _prepare(mod, target, fuse_graph, remove_padding, None, None,
                                                            precision, templates, calibration, kv_cache)
    scheduled = schedule(lowered, target, records=records, templates=templates)
    if transfer is not None:
        if transfer.table.kernels and records is None:
            note = note.replace("; building untuned", "")
        note += "; " + transfer_note(transfer)
    logger.info(note)
    weights = []
    if lift_weights:
        from .codegen.weights import lift_weights as lift

        scheduled, weights = lift(scheduled)
    executable = finalize(scheduled, target)
    return Compiled(executable, target, report, records, note, weights,
                    transferred=table.applied() if table is not None else [],
                    transfer_refusals=transfer.summary() if transfer is not None else {}, logs=logs,
                    precision=precision_report, kv_cache=kv_report)


def transfer_note(transfer) -> str:
    """One clause: how many kernels took tuned knobs, from how many directories, and what did not transfer."""
    table = transfer.table
    text = (f"tuned knobs on {table.kernels} kernel{'s' if table.kernels != 1 else ''} no record matches "
            f"({len(table.scheduled)} of {len(table)} signatures from {len(transfer.directories)} "
            f"record director{'ies' if len(transfer.directories) != 1 else 'y'})")
    refused = transfer.summary()["not_transferred"]
    return text + (f", {refused} records could not transfer" if refused else "")


def build(mod: tvm.IRModule, target: TargetSpec = None, logs: Optional[str] = None, fuse: bool = True,
          knobs: Optional[dict] = None, remove_padding: bool = False, precision: str = "fp32", calibration=None,
          kv_cache: str = "concat"):
    """:func:`compile_model`, returning just the executable (run it with ``relax.VirtualMachine(ex, dev)``).

    As a convenience for running in this process, a CPU build also sizes TVM's thread pool to the target's
    cores (:func:`~tvm_fusion_ext.deploy.threads.configure_cpu_threads`)."""
    compiled = compile_model(mod, target, logs=logs, fuse_graph=fuse, knobs=knobs, remove_padding=remove_padding,
                             precision=precision, calibration=calibration, kv_cache=kv_cache)
    info = TargetInfo.of(compiled.target)
    if info.is_cpu:
        from ..deploy.threads import configure_cpu_threads

        configure_cpu_threads(info.cores)
    return compiled.executable
