"""CPU transcendental math as arithmetic LLVM can vectorise."""

from __future__ import annotations

import tvm

from ...targets import TargetInfo


def VectorisableMath(target: tvm.target.Target) -> tvm.transform.Pass:  # noqa: N802
    """CPU: fp32 ``erf``/``exp``/``sigmoid``/``tanh`` -> the arithmetic forms of :mod:`...ops.fastmath`. LLVM
    lowers them to one scalar libm call per lane, which made a stock erf-GELU epilogue cost as much as its
    GEMM and MiniLM's softmax (12×128×128) take over a millisecond."""
    import tvm_ffi

    from ...ops.fastmath import REPLACEMENTS

    ops = {tvm.ir.Op.get(name): fn for name, fn in REPLACEMENTS.items()}

    def rewrite(call):
        if isinstance(call.op, tvm.ir.Op):
            for op, fn in ops.items():
                if call.op.same_as(op):
                    return fn(call.args[0])
        return call

    @tvm.transform.module_pass(opt_level=0, name="tfx.VectorisableMath")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not TargetInfo.of(target).is_cpu:
            return mod
        out = None
        for gv, func in list(mod.functions_items()):
            if isinstance(func, tvm.tirx.PrimFunc):
                new = tvm_ffi.structural_map(func, (tvm.ir.expr.Call, rewrite))
                if not new.same_as(func):
                    out = out if out is not None else mod.clone()  # a Python module pass gets the caller's module
                    out[gv] = new
        return out if out is not None else mod

    return _pass
