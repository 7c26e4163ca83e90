"""A parallel loop whose size is known only at run time runs on the calling thread when a call is small.

Templates and the fallback schedule parallelise a kernel's outer loop over rows (tokens × heads, tokens × columns
blocks): right for a request of hundreds of tokens, but a decode step has one token per sequence, and a kernel of
1024 elements (a residual add, an RMSNorm of one row, a split of one token's QKV) then still goes through the
thread pool: every worker is woken and the call waits at the pool's barrier for all of them, even those with no
iteration to run. On a machine whose cores are shared, a worker that is not running makes that barrier wait for
a time slice: measured on a LLaMA-shaped decoder (8 layers, hidden 1024) at batch 1 on the loaded 2-core VM, a
residual add took 4.6 ms per call, an RMSNorm 3.0 ms, a QKV split 4.8 ms (over a third of the step).

:func:`SerialWhenSmall` gives each such loop a run-time test: ``if extent × work per iteration >=
MIN_PARALLEL_WORK`` the loop as scheduled, else the same loop serial. The work per iteration counts the
iterations of the loops nested inside (sizes that are only known inside count as 1, so the test never reads a
variable out of its scope). Loops of static extent keep what the schedule chose (the fallback already keeps
small static kernels serial). Both branches compute the same values in the same order per element.

Every build guards the kernels of the fallback schedule (residual adds, splits, transposes, copies, rotary
embeddings) and of the row-wise templates (:data:`ROW_RULES`: int8's row quantisation, RMSNorm, LayerNorm): one
parallel task per row or per element block. On a decode step they are the calls that pay the pool for a row of work:
int8's row quantisation in front of each of a LLaMA-1024 step's 25 int8 denses took 16-66 µs a call for 1024 values
on the loaded 2-core VM (2-7 µs on the calling thread), its residual adds, QKV splits and head transposes as much.
The other templates' kernels (attention, dense) are guarded only on request (``TFX_SERIAL_WHEN_SMALL=1`` when
compiling): a padding-free encoder's packed attention (query tiles over a run-time token count) fails to compile
with the guard (a division by zero while TVM folds the copy's index expressions). ``TFX_SERIAL_WHEN_SMALL=0`` guards
none.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ...tir_nodes import collect, substitute

#: iterations below which a loop runs serial: about 30-60 µs of elementwise work on one core, what a launch
#: whose workers sleep between calls (passive waiting: the default on a shared machine) costs to wake them. 4096
#: (the fallback schedule's threshold for static kernels) still sent a 4-token decode step's residual adds and
#: RMSNorms through the pool: 6.8 and 4.3 ms per call on the loaded VM
MIN_PARALLEL_WORK = 32768


#: the templates (block annotation ``schedule_rule``) whose kernels every build guards, besides the fallback's
ROW_RULES = ("tfx.quantize_rows", "tfx.rmsnorm", "tfx.layernorm")
#: their operators (the kernel's ``tfx.op``)
ROW_OPS = ("fused_quantize_rows", "fused_rmsnorm", "fused_layernorm")


def serial_when_small_rules() -> Optional[Tuple[str, ...]]:
    """The templates whose kernels a build guards besides the fallback's: None for every kernel
    (``TFX_SERIAL_WHEN_SMALL=1``), ``()`` for none at all (``=0``), else :data:`ROW_RULES`."""
    import os

    flag = os.environ.get("TFX_SERIAL_WHEN_SMALL")
    return None if flag == "1" else () if flag == "0" else ROW_RULES


def SerialWhenSmall(rules: Optional[Sequence[str]] = None) -> tvm.transform.Pass:  # noqa: N802
    """Module pass over a scheduled CPU module: see the module docstring. ``rules``: guard only the fallback's
    kernels and those of these templates (None: every kernel)."""
    wanted = None if rules is None else set(rules)
    ops = {op for op, rule in zip(ROW_OPS, ROW_RULES) if wanted is not None and rule in wanted}

    @tvm.transform.module_pass(opt_level=0, name="tfx.SerialWhenSmall")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        out = None
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            if wanted is not None and not _only_these_templates(func, wanted, ops):
                continue
            body = tvm_ffi.structural_map(func.body, (tirx.For, _guard))
            if not body.same_as(func.body):
                out = out if out is not None else mod.clone()
                out[gv] = func.with_body(body).with_attr("tfx.serial_when_small", True)
        return out if out is not None else mod

    return _pass


def _only_these_templates(func: tirx.PrimFunc, rules: set, ops: set) -> bool:
    """Whether ``func`` is the fallback's (no template's block: a stock operator, or one of ours that no CPU
    template takes, such as the rotary embedding) or only these templates'."""
    templates = {str(b.annotations["schedule_rule"]) for b in collect(func.body, s_tir.SBlock)
                 if "schedule_rule" in b.annotations}
    if not templates:
        return True
    op = func.attrs.get("tfx.op") if func.attrs is not None else None
    return (op is None or str(op) in ops) and templates <= rules


def _guard(loop: tirx.For):
    if loop.kind != tirx.ForKind.PARALLEL or isinstance(loop.extent, tirx.IntImm) or _ranges_read(loop):
        return loop
    inner = _bound_inside(loop.body)
    work = _int64(loop.extent) * _work(loop.body, inner)
    # the copy's loop variable is its own: analysers bind one range per variable (inner loops and blocks repeat
    # theirs with the same ranges, which they accept)
    var = tirx.Var(f"{loop.loop_var.name}_serial", loop.loop_var.ty)
    serial = tirx.For(var, loop.min, loop.extent, tirx.ForKind.SERIAL, substitute(loop.body, {loop.loop_var: var}),
                      loop.thread_binding, loop.annotations)
    return tirx.IfThenElse(work >= tirx.IntImm("int64", MIN_PARALLEL_WORK), loop, serial)


def _ranges_read(loop: tirx.For) -> bool:
    """Whether a loop or block inside ``loop`` has a range that reads ``loop``'s variable (packed attention's key
    blocks per sequence): its copy would give that inner variable a second range, and TVM's analysers bind one
    range per variable. Such kernels do enough work per iteration to keep their parallel loop."""
    def reads(e) -> bool:
        return any(v.same_as(loop.loop_var) for v in tirx.analysis.undefined_vars(e))

    if any(reads(f.min) or reads(f.extent) for f in collect(loop.body, tirx.For)):
        return True
    return any(reads(iv.dom.min) or reads(iv.dom.extent) for b in collect(loop.body, s_tir.SBlock)
               for iv in b.iter_vars)


def _int64(e):
    return e if str(e.ty) == "int64" else e.astype("int64")


def _bound_inside(stmt) -> set:
    """Variables defined inside ``stmt`` (loop, let and block iteration variables): a test outside cannot read
    them."""
    names = set()

    def note(node):
        for attr in ("loop_var", "var"):
            v = getattr(node, attr, None)
            if isinstance(v, tirx.Var):
                names.add(v)
        for iv in getattr(node, "iter_vars", []) or []:
            names.add(iv.var)
        return node

    for kind in (tirx.For, tirx.LetStmt, s_tir.SBlock):
        tvm_ffi.structural_map(stmt, (kind, note))
    return names


def _work(stmt, inner: set):
    """Iterations of the loop nests in ``stmt`` (a sum over statements in sequence, the larger branch of an if)."""
    one = tirx.IntImm("int64", 1)
    if isinstance(stmt, tirx.For):
        extent = stmt.extent
        known = not (set(tirx.analysis.undefined_vars(extent)) & inner)
        return (_int64(extent) if known else one) * _work(stmt.body, inner)
    if isinstance(stmt, tirx.SeqStmt):
        total = None
        for s in stmt.seq:
            w = _work(s, inner)
            total = w if total is None else total + w
        return total if total is not None else one
    if isinstance(stmt, tirx.IfThenElse):
        a = _work(stmt.then_case, inner)
        return a if stmt.else_case is None else tirx.max(a, _work(stmt.else_case, inner))
    for attr in ("body", "block"):
        child = getattr(stmt, attr, None)
        if isinstance(child, tirx.Stmt):
            return _work(child, inner)
    return one
