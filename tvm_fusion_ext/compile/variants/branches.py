"""Run-time choice between a scheduled kernel and variants of it: the operator rebuilt with other parameters
(a shorter key block, a thinner row tile), scheduled by the same rules and branched to on the kernel's own
symbolic sizes.

A variant reads and writes exactly the kernel's buffers, so it becomes a branch of the kernel's PrimFunc: the
Relax graph, the tuner's tasks and the records are unchanged. Only a template's schedule is worth a branch; a
variant that no template schedules, or that the template fails on, is dropped with the reason (the kernel as
built is always correct). Users: :mod:`.short_keys`, :mod:`.short_rows`, :mod:`.query_tiles`.
"""

from __future__ import annotations

import logging
import warnings
from typing import Callable, List, Optional, Tuple

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ...ops.registry import inputs_of, make_prim_func, op_of
from ...schedules.kernel_knobs import VARIANT_OF, kernel_signature
from ...targets import TargetInfo
from ...tir_nodes import substitute

#: module of one unscheduled PrimFunc → scheduled module (the build's templates; records name static kernels,
#: so none would match a variant)
ScheduleFn = Callable[[tvm.IRModule], tvm.IRModule]


def cpu_dispatch_pass(name: str, target: tvm.target.Target, refusal: Callable[[object], Optional[str]],
                      dispatch: Callable[[tirx.PrimFunc, ScheduleFn], Optional[tirx.PrimFunc]],
                      schedule_fn: ScheduleFn, logger: logging.Logger) -> tvm.transform.Pass:
    """Module pass over a scheduled CPU module: each PrimFunc ``refusal`` accepts (None) is replaced by
    ``dispatch(func, schedule_fn)`` when that makes one; ``refusal``'s reasons are logged at debug level ("" for a
    function that is not a candidate at all). Other targets pass through."""
    return dispatch_pass(name, target, refusal, dispatch, schedule_fn, logger, families=("cpu",))


def dispatch_pass(name: str, target: tvm.target.Target, refusal: Callable[[object], Optional[str]],
                  dispatch: Callable[[tirx.PrimFunc, ScheduleFn], Optional[tirx.PrimFunc]],
                  schedule_fn: ScheduleFn, logger: logging.Logger, families=("cpu",)) -> tvm.transform.Pass:
    """:func:`cpu_dispatch_pass` for the target families named (``TargetInfo.family``: "cpu", "cuda"). A branch
    is a host-side choice between kernel launches on a GPU: each body's thread-bound loops become kernels of
    their own, the ``if`` on the symbolic size stays in the host function."""

    @tvm.transform.module_pass(opt_level=0, name=name)
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if TargetInfo.of(target).family not in families:
            return mod
        out = None
        for gv, func in mod.functions_items():
            reason = refusal(func)
            if reason is not None:
                if reason:
                    logger.debug("%s: no %s (%s)", gv.name_hint, name, reason)
                continue
            new = dispatch(func, schedule_fn)
            if new is not None:
                out = out if out is not None else mod.clone()  # a Python module pass gets the caller's module
                out[gv] = new
        return out if out is not None else mod

    return _pass


def scheduled_variant(func: tirx.PrimFunc, params: dict,
                      schedule_fn: ScheduleFn) -> Tuple[Optional[tirx.Stmt], str]:
    """The body of ``func``'s operator rebuilt with ``params`` and scheduled by ``schedule_fn``, reading
    ``func``'s own parameters; or (None, why)."""
    types = {name: _tensor_type(p.ty) for name, p in zip(inputs_of(func), func.params)}
    try:
        variant = make_prim_func(op_of(func), types, params)
        signature = kernel_signature(func)
        if signature is not None:  # a copy of the kernel is not another kernel that took tuned knobs
            variant = variant.with_attr(VARIANT_OF, signature)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            scheduled = schedule_fn(tvm.IRModule({"variant": variant}))["variant"]
    except Exception as err:  # noqa: BLE001  (an optimisation: the kernel as built is always correct)
        text = str(err).strip().splitlines()
        return None, f"failed: {text[-1] if text else type(err).__name__}"
    if caught:
        return None, f"failed its template: {caught[0].message}"
    if scheduled.attrs is None or not scheduled.attrs.get("tirx.is_scheduled", False):
        return None, "was not scheduled by a template"
    body = _rebind(scheduled, func)
    return (body, "") if body is not None else (None, "does not take the kernel's parameters")


def with_variants(func: tirx.PrimFunc, size: tirx.PrimExpr, variants: List[Tuple[int, str, dict]],
                  schedule_fn: ScheduleFn, attr: str, logger: logging.Logger) -> Optional[tirx.PrimFunc]:
    """``func`` running, for each ``(bound, label, params)`` in order, the operator rebuilt with ``params`` when
    ``size`` does not exceed ``bound``, else its own body; the bounds recorded in ``attr``. None (and the reason
    logged) when a variant cannot be made: then the kernel stays as built."""
    size = size if str(size.ty) == "int64" else size.astype("int64")
    cases = [(size <= tirx.IntImm("int64", bound), label, params) for bound, label, params in variants]
    return with_cases(func, cases, schedule_fn, attr, ",".join(str(bound) for bound, _, _ in variants), logger)


def with_cases(func: tirx.PrimFunc, cases: List[Tuple[tirx.PrimExpr, str, dict]], schedule_fn: ScheduleFn,
               attr: str, attr_value: str, logger: logging.Logger, launches: bool = False) -> Optional[tirx.PrimFunc]:
    """``func`` running, for the first ``(condition, label, params)`` whose condition holds, the operator rebuilt
    with ``params``, else its own body; ``attr_value`` recorded in ``attr``. None (and the reason logged) when a
    variant cannot be made: then the kernel stays as built.

    ``launches``: the bodies are GPU kernel launches, and the branch a host-side choice between them. Two things
    TVM's GPU lowering needs then: the conditions marked thread-invariant (``tvm_thread_invariant``; ThreadSync
    otherwise takes each kernel's barriers for syncs under a condition and refuses them), and one root block
    above the branch (global buffers shared by two kernels of a body are allocated at the function's root block;
    with none there, their allocation is lost)."""
    bodies: List[Tuple[tirx.PrimExpr, tirx.Stmt]] = []
    for condition, label, params in cases:
        body, why = scheduled_variant(func, params, schedule_fn)
        if body is None:
            logger.info("no run-time branches (%s) for a %s kernel: the %s variant %s", attr, op_of(func), label, why)
            return None
        bodies.append((condition, body))
    out = func.body
    for condition, body in reversed(bodies):
        if launches:
            condition = tirx.call_intrin("bool", "tirx.tvm_thread_invariant", condition)
        out = tirx.IfThenElse(condition, body, out)
    if launches:
        out = s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], "root", out))
    return func.with_body(out).with_attr(attr, attr_value)


def plain_parameters(func: tirx.PrimFunc) -> bool:
    """The kernel's parameters are its operator's inputs and its output, nothing else (no scalar sizes): what
    a variant's parameters are matched against one by one."""
    return len(func.params) == len(inputs_of(func)) + 1


def _tensor_type(buffer) -> tvm.relax.TensorType:
    # the kernel's own size variables, so that the variant's buffers have exactly the kernel's shapes
    return tvm.relax.TensorType(list(buffer.shape), str(buffer.dtype))


def _rebind(variant: tirx.PrimFunc, func: tirx.PrimFunc) -> Optional[tirx.Stmt]:
    """The variant's body reading and writing ``func``'s parameters (buffers of the same types, built from the
    kernel's own size variables; 0.27: a parameter is the variable its buffer is loaded through)."""
    if len(variant.params) != len(func.params):
        return None
    for vp, fp in zip(variant.params, func.params):
        if not tvm_ffi.structural_equal(vp.ty, fp.ty):
            return None
    return substitute(variant.body, {vp: fp for vp, fp in zip(variant.params, func.params)})
