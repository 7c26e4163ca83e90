"""Symbolic CPU attention dispatches short requests to kernels with smaller key blocks.

A ``fused_attention`` whose key count is known only at run time is built with 128-key blocks
(:data:`~tvm_fusion_ext.ops.attention.SYMBOLIC_KEY_BLOCK`): fewer online-softmax folds on long requests, and the
signature of records tuned at 128 tokens. A request of 48 tokens then computes scores for 128 keys, 80 of them
padding: measured on MiniLM's six layers at (1, 48), 0.79 ms against 0.47 ms for the static kernel (64-key
blocks), a third of the artifact's gap to the static build there (with the branches: 0.42 ms, the static kernel
0.53 ms, in another session's runs).

This pass gives each such kernel a run-time choice: ``if T <= 32`` a kernel with 32-key blocks, ``elif T <= 64``
one with 64-key blocks, else the kernel as built. Each variant is the operator with another ``key_block``
parameter, scheduled by the same rules (its own signature takes the knobs of records tuned at that many keys,
else the template's defaults), and bounded like the others when causal. They read the same buffers, so the
variants become the two branches of one PrimFunc: the Relax graph, the tuner's tasks and the records are
unchanged. Padded keys weigh exactly 0 in every variant, so the branch changes no result beyond rounding order.

CUDA's symbolic attention already uses 32-key blocks; packed (varlen) attention bounds its own loop by the
sequences a tile spans (:mod:`.causal_skip`). Neither is touched, nor is any kernel whose structure the pass
does not recognise (the branch is an optimisation).
"""

from __future__ import annotations

import logging
import warnings
from typing import Callable, List, Optional, Tuple

import tvm
import tvm_ffi
from tvm import tirx

from ..ops.attention import SYMBOLIC_KEY_BLOCK, key_geometry
from ..ops.registry import inputs_of, make_prim_func, op_of, params_of
from ..targets import TargetInfo

logger = logging.getLogger(__name__)

#: key blocks of the short-request variants, smallest first: a request of T keys takes the first block ≥ T
SHORT_KEY_BLOCKS = (32, 64)

#: module of one unscheduled PrimFunc → scheduled module (the build's templates and causal bound; records name
#: static kernels, so none would match a variant)
ScheduleFn = Callable[[tvm.IRModule], tvm.IRModule]


def DispatchShortKeys(target: tvm.target.Target, schedule_fn: ScheduleFn) -> tvm.transform.Pass:  # noqa: N802
    """Module pass over a scheduled module: every symbolic-key CPU ``fused_attention`` becomes a run-time
    choice between itself and variants with :data:`SHORT_KEY_BLOCKS`, scheduled by ``schedule_fn`` (templates
    only, no fallback: a variant no template schedules is not worth a branch)."""

    @tvm.transform.module_pass(opt_level=0, name="tfx.DispatchShortKeys")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not TargetInfo.of(target).is_cpu:
            return mod
        out = None
        for gv, func in mod.functions_items():
            reason = _refusal(func)
            if reason is not None:
                if reason:
                    logger.debug("%s: no short-key dispatch (%s)", gv.name_hint, reason)
                continue
            new = dispatch(func, schedule_fn)
            if new is not None:
                out = out if out is not None else mod.clone()  # a Python module pass gets the caller's module
                out[gv] = new
        return out if out is not None else mod

    return _pass


def _refusal(func) -> Optional[str]:
    """Why ``func`` gets no dispatch ("" when it is not a candidate at all), or None when it does."""
    if not isinstance(func, tirx.PrimFunc) or op_of(func) != "fused_attention":
        return ""
    if "cu_seqlens" in inputs_of(func):
        return "packed attention: its loop is bounded by its sequences"
    S, T, kb = key_geometry(func)
    if isinstance(T, int):
        return ""
    if kb <= max(SHORT_KEY_BLOCKS):
        return f"key block {kb} is already short"
    if len(func.params) != len(inputs_of(func)) + 1:
        return "scalar size parameters"  # the variants' parameters are matched to the kernel's one by one
    return None


def dispatch(func: tirx.PrimFunc, schedule_fn: ScheduleFn) -> Optional[tirx.PrimFunc]:
    """``func`` (scheduled) with its short-key variants in front of it, or None when a variant cannot be made."""
    _, T, _ = key_geometry(func)
    types = {name: _tensor_type(p.ty) for name, p in zip(inputs_of(func), func.params)}
    branches: List[Tuple[int, tirx.Stmt]] = []
    for kb in SHORT_KEY_BLOCKS:
        scheduled, why = _variant(func, types, kb, schedule_fn)
        body = _rebind(scheduled, func) if scheduled is not None else None
        if body is None:
            logger.info("no short-key dispatch for a fused_attention kernel: the %d-key variant %s", kb,
                        why or "does not take the kernel's parameters")
            return None
        branches.append((kb, body))
    keys = T if str(T.ty) == "int64" else T.astype("int64")
    body = func.body
    for kb, branch in reversed(branches):
        body = tirx.IfThenElse(keys <= tirx.IntImm("int64", kb), branch, body)
    return func.with_body(body).with_attr("tfx.short_key_blocks", ",".join(str(kb) for kb, _ in branches))


def _variant(func, types, kb: int, schedule_fn: ScheduleFn) -> Tuple[Optional[tirx.PrimFunc], str]:
    """The scheduled variant with ``kb``-key blocks, or (None, why). Only a template's schedule is worth a
    branch: a variant the template fails on (knobs given for 128-key blocks split no 64-key one) is dropped,
    quietly, since the user asked for the kernel, not for its variants."""
    try:
        variant = make_prim_func("fused_attention", types, dict(params_of(func), key_block=kb))
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
    return scheduled, ""


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
    binding = {vp: fp for vp, fp in zip(variant.params, func.params)}
    return tvm_ffi.structural_map(variant.body, (tirx.Var, lambda v: binding.get(v, v)))
