"""Scheduling a lowered module, in order of trust: tuning records, then our templates (expert default knobs or
given ones), then a generic fallback for every other kernel (CPU: ours; CUDA: dlight's).

After them, the run-time variants (:mod:`.variants`): causal attention's key-block loops bounded by their query
tiles (:mod:`.variants.causal_skip`, CPU), then symbolic CPU attention's long-request query tiles
(:mod:`.variants.query_tiles`) and attention and dense kernels' short-request branches
(:mod:`.variants.short_keys`, :mod:`.variants.short_rows`), and last its one-row (decode) requests' split-K kernel
(:mod:`.variants.decode`), each scheduled by the same template rules."""

from __future__ import annotations

import os
from typing import List, Optional

import tvm
from tvm import relax

from ..errors import TuningLogError
from ..targets import TargetInfo, TargetSpec, resolved_target


def ApplyTemplates(target: TargetSpec = None, knobs: Optional[dict] = None,  # noqa: N802
                   fallback: bool = True, kernel_knobs=None, templates: Optional[List] = None) -> tvm.transform.Pass:
    """Schedule every not-yet-scheduled PrimFunc with the first rule that takes it: the target's templates
    (``knobs`` maps a block rule such as ``"tfx.dense"`` to its knobs; ``kernel_knobs``, a
    :class:`~tvm_fusion_ext.schedules.kernel_knobs.KernelKnobs`, gives tuned knobs per kernel signature over
    them), then, with ``fallback``, the generic rules. ``templates``: the compilation's template rules when the
    caller built them already (then ``knobs`` and ``kernel_knobs`` are theirs). Marks what it scheduled; never
    changes the caller's module."""
    from tvm.s_tir import dlight as dl

    from ..schedules.registry import fallback_rules, template_rules

    target = resolved_target(target)
    if templates is None:
        templates = template_rules(target, knobs, kernel_knobs)
    rules = list(templates) + (fallback_rules(target) if fallback else [])
    apply = dl.ApplyDefaultSchedule(*rules)

    @tvm.transform.module_pass(opt_level=0, name="tfx.ApplyTemplates")
    def _pass(mod: tvm.IRModule, ctx) -> tvm.IRModule:
        with target:
            # ApplyDefaultSchedule assigns into the module it is given: give it a copy
            return apply.transform_module(mod.clone(), ctx)

    return _pass


def apply_records(mod: tvm.IRModule, target: tvm.target.Target, record_dir: str) -> tvm.IRModule:
    """Replace each kernel that has a tuning record in ``record_dir`` by its best record's schedule."""
    from ..records import open_database
    from ..schedules.registry import prepare_for_records

    if not os.path.isdir(record_dir):
        raise TuningLogError(f"tuning-log directory '{record_dir}' does not exist")
    prepare_for_records(target)
    try:
        database = open_database(record_dir)  # cuts a half-written last line left by a killed tuning run
    except TuningLogError:
        raise
    except Exception as err:  # noqa: BLE001
        raise TuningLogError(f"cannot read tuning logs in '{record_dir}': {str(err).splitlines()[-1]}") from None
    with target, database:
        return relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)


def schedule(mod: tvm.IRModule, target: TargetSpec = None, records: Optional[str] = None,
             knobs: Optional[dict] = None, kernel_knobs=None, templates: Optional[List] = None) -> tvm.IRModule:
    """Schedule a lowered module: ``records`` (a record directory) first, then templates (with ``knobs`` and
    the per-kernel ``kernel_knobs`` transferred from records), then the fallback; then bound causal attention's
    key-block loops by their query tiles (whichever schedule made them), and give symbolic CPU attention its
    long-request query tiles (:mod:`.variants.query_tiles`) and attention and dense kernels their short-request
    variants (:mod:`.variants.short_keys`, :mod:`.variants.short_rows`), then attention's decode kernel for one-row
    requests (:mod:`.variants.decode`, the outermost branch). ``templates``: the compilation's template rules
    when the caller built them already (:func:`~.pipeline.compile_model` does: the same list its lowering used)."""
    from ..schedules.registry import template_rules
    from .variants.causal_skip import SkipMaskedKeyBlocks
    from .variants.decode import DispatchDecode
    from .variants.query_tiles import DispatchQueryTiles
    from .variants.short_keys import DispatchShortKeys
    from .variants.short_rows import DispatchShortRows

    target = resolved_target(target)
    if templates is None:
        templates = template_rules(target, knobs, kernel_knobs)
    if records is not None:
        mod = apply_records(mod, target, records)

    # CPU only: on an H100 (scripts/gpu_check.py) the bound broke the CUDA kernels it touched with symbolic sizes,
    # causal attention over a run-time length and packed (varlen) attention, both matching numpy without it; the
    # bound is an optimisation and the per-key causal test the semantics, so CUDA keeps the full key loop
    skip = (lambda m: m) if TargetInfo.of(target).is_cuda else SkipMaskedKeyBlocks()

    with_fallback = ApplyTemplates(target, fallback=True, templates=templates)
    # a variant's kernel never has a record (records name static kernels): templates and transferred knobs
    templates_only = ApplyTemplates(target, fallback=False, templates=templates)
    variants = lambda m: skip(templates_only(m))  # noqa: E731
    scheduled = DispatchQueryTiles(target, variants)(skip(with_fallback(mod)))
    scheduled = DispatchShortRows(target, variants)(DispatchShortKeys(target, variants)(scheduled))
    return DispatchDecode(target, variants)(scheduled)
