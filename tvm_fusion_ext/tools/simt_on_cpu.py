"""The CUDA family's SIMT templates run on this CPU: compiled for an OpenCL target that stands in for a CUDA GPU
(:func:`~tvm_fusion_ext.targets.opencl_emulation_target`) and launched by PoCL through ``pyopencl``.

What this checks and what it cannot: a GPU-style schedule's indexing, its shared-memory staging, the barriers
between cooperative stores and loads, cross-thread reductions, and its bounds at sizes known only at run time
(symbolic extents become kernel arguments). Not tensor-core instructions (the templates take their SIMT paths
on this target: :attr:`TargetInfo.tensor_cores`), not warp shuffles (TVM's OpenCL reductions go through shared
memory), not code that relies on a warp's lockstep, not speed. PoCL's CPU device has no ``cl_khr_fp16``:
16-bit kernels run with ``half`` storage widened to ``float`` (inputs rounded to fp16 first, outputs rounded
after), which keeps the schedule's indexing and staging but not fp16 rounding inside the kernel.

TVM's wheel has no OpenCL runtime, so the host side is done here: the module is lowered up to the split of host
and device code (before the packed-call API), the OpenCL C of the kernels is taken from TVM's codegen, and the
host function (buffer allocations, views and ``call_ffi_kernel`` launches with their grid and block extents) is
interpreted with the symbolic sizes bound from the arrays given. Every buffer has guard zones filled with NaN
before and after it: a read out of bounds shows as NaN in the result, a write out of bounds is reported.

:func:`emulate_relax` does the same for a whole scheduled Relax module (the symbolic chains, packed attention):
every kernel call becomes a call into this module, the rest runs on the CPU through the VM.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import tvm
from tvm import tirx

_MODULES = itertools.count()
#: bytes of NaN before and after every buffer (a multiple of any base-address alignment a device asks for)
GUARD_BYTES = 4096
_NAN_WORD = np.uint32(0x7FC00001)  # a quiet NaN as float32; as float64 pairs also NaN


# -- the device -----------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _device():
    """``(context, queue, device)`` of the first OpenCL CPU device, or a string saying why there is none."""
    try:
        import pyopencl as cl
    except ImportError:
        return "pyopencl is not installed (pip install pyopencl)"
    try:
        platforms = cl.get_platforms()
    except Exception as err:  # noqa: BLE001  (no ICD loader / no platform: pyopencl raises its LogicError)
        return f"no OpenCL platform ({str(err).splitlines()[0]}; apt-get install pocl-opencl-icd)"
    for platform in platforms:
        for device in platform.get_devices():
            if device.type & cl.device_type.CPU:
                ctx = cl.Context([device])
                return ctx, cl.CommandQueue(ctx), device
    return "no OpenCL CPU device (apt-get install pocl-opencl-icd)"


def unavailable() -> Optional[str]:
    """Why kernels cannot run here (no pyopencl, no PoCL), or None when they can."""
    found = _device()
    return found if isinstance(found, str) else None


def _has_fp16() -> bool:
    return "cl_khr_fp16" in _device()[2].extensions


# -- lowering -------------------------------------------------------------------------------------------------------
def _lower(mod: tvm.IRModule, target: tvm.target.Target):
    """``(host PrimFunc, OpenCL C source)``: TVM's own pipeline for ``target`` up to the host/device split, without
    the packed-call API (and the storage legalisations that must follow it), so that the host function still shows
    its buffers and kernel launches; the device functions through TVM's device finalisation and codegen."""
    from tvm.s_tir import pipeline as s_tir_pipeline
    from tvm.tirx.build import codegen_build

    mod = tvm.tirx.transform.BindTarget(target.with_host(target.host or "llvm"))(mod)
    skipped = ("MakePackedAPI", "FP8StorageLegalize", "BF16StorageLegalize")
    saved = {name: getattr(tirx.transform, name) for name in skipped}
    try:  # the pipeline looks these up when it runs: identity passes for the three it must not apply here
        for name in skipped:
            setattr(tirx.transform, name, lambda: tvm.transform.Sequential([]))
        pipeline, _, finalize_device = s_tir_pipeline.default_s_tir_pipeline()
        with target:
            lowered = pipeline(mod)
    finally:
        for name, value in saved.items():
            setattr(tirx.transform, name, value)
    # kernels are the device-launch functions (calling_conv 2); what is left is the host entry, which keeps the
    # device target until MakePackedAPI, so TVM's own split would not tell them apart yet
    kernels = {gv: f for gv, f in lowered.functions_items() if int(f.attrs.get("calling_conv", 0) or 0) == 2}
    (entry,) = [f for gv, f in lowered.functions_items() if gv not in kernels]
    device_target = next(iter(kernels.values())).attrs["target"]
    with target:
        source = codegen_build(finalize_device()(tvm.IRModule(kernels, attrs=lowered.attrs)),
                               device_target).inspect_source()
    return entry, source


def _widen_half(source: str) -> str:
    """OpenCL C with ``half`` storage as ``float`` (for a device without ``cl_khr_fp16``)."""
    source = re.sub(r"#ifdef cl_khr_fp16\n.*?#endif\n", "", source, flags=re.S)  # TVM's fp16-or-#error guard
    source = re.sub(r"#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n?", "", source)
    source = re.sub(r"\bconvert_half(\d*)", r"convert_float\1", source)
    return re.sub(r"\bhalf(\d*)\b", r"float\1", source)


_SHARED = re.compile(r"^  ((?:volatile )?__local (float|double)\d* (\w+)\[(\d+)\];)$", re.M)


def _poison_shared(source: str) -> str:
    """Every float array in shared (``__local``) memory filled with NaN at the start of the kernel, all work-items
    taking part, then a barrier: a read of shared memory no thread of the block wrote shows as NaN in the result.
    (A GPU leaves there what an earlier kernel wrote, usually finite: such a read can pass there by luck, and
    PoCL, which reuses one scratch area, would otherwise make the result depend on the kernels run before.)"""
    flat = ("(get_local_id(0) + get_local_size(0) * (get_local_id(1) + get_local_size(1) * get_local_id(2)))")
    size = "(get_local_size(0) * get_local_size(1) * get_local_size(2))"

    def fill(m):
        decl, _, name, n = m.groups()
        return (f"  {decl}\n  for (int tfx_p = {flat}; tfx_p < {n}; tfx_p += {size}) {name}[tfx_p] = NAN;\n"
                f"  barrier(CLK_LOCAL_MEM_FENCE);")

    return _SHARED.sub(fill, source)


# -- the host side, interpreted ---------------------------------------------------------------------------------------
_BINARY = {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
    "FloorDiv": lambda a, b: a // b, "FloorMod": lambda a, b: a % b, "Min": min, "Max": max,
    "Div": lambda a, b: int(a / b) if isinstance(a, int) else a / b,
    "Mod": lambda a, b: a - int(a / b) * b,
    "EQ": lambda a, b: a == b, "NE": lambda a, b: a != b, "LT": lambda a, b: a < b, "LE": lambda a, b: a <= b,
    "GT": lambda a, b: a > b, "GE": lambda a, b: a >= b, "And": lambda a, b: a and b, "Or": lambda a, b: a or b,
}


def _eval(expr, env: dict):
    """A host scalar expression's value under ``env`` (Var → int)."""
    if isinstance(expr, (int, float)):
        return expr
    kind = type(expr).__name__
    if kind == "IntImm":
        return int(expr.value)
    if kind == "FloatImm":
        return float(expr.value)
    if kind in ("Var", "SizeVar"):
        if expr not in env:
            raise KeyError(f"host value {expr} is not bound")
        return env[expr]
    if kind in _BINARY:
        return _BINARY[kind](_eval(expr.a, env), _eval(expr.b, env))
    if kind == "Not":
        return not _eval(expr.a, env)
    if kind == "Cast":
        value = _eval(expr.value, env)
        return int(value) if str(expr.dtype).startswith(("int", "uint")) else value
    if kind == "Select":
        return _eval(expr.true_value if _eval(expr.condition, env) else expr.false_value, env)
    if kind == "Call" and expr.op.name == "tirx.tvm_thread_invariant":  # a host branch around kernel launches
        return _eval(expr.args[0], env)
    if kind == "Call" and expr.op.name == "tirx.if_then_else":
        cond, then, other = expr.args
        return _eval(then if _eval(cond, env) else other, env)
    raise NotImplementedError(f"host expression {kind}: {expr}")


@dataclass
class _Buffer:
    mem: object          # the guarded cl.Buffer
    view: object         # its sub-buffer between the guards
    nbytes: int


def _itemsize(dtype: str, widened: bool) -> int:
    if widened and dtype == "float16":
        return 4
    return tvm.runtime.DataType(dtype).bits // 8 * max(1, tvm.runtime.DataType(dtype).lanes)


def _storage_dtype(dtype: str, widened: bool) -> np.dtype:
    return np.dtype("float32" if widened and dtype == "float16" else dtype)


class OpenCLFunction:
    """One scheduled PrimFunc (``mod["main"]``, or the module's only PrimFunc) compiled for an OpenCL target and
    callable with numpy arrays: ``fn(*inputs_and_outputs, **scalars)`` fills the output arrays in place (the
    destination-passing style of a TVM PrimFunc)."""

    def __init__(self, mod: tvm.IRModule, target: tvm.target.Target):
        import pyopencl as cl

        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        self.host, source = _lower(mod, target)
        self.widened = "half" in source and not _has_fp16()
        source = _widen_half(source) if self.widened else source
        self.source = _poison_shared(source)
        ctx, self.queue, _ = _device()
        try:
            self.program = cl.Program(ctx, self.source).build()
        except cl.RuntimeError as err:
            raise RuntimeError(f"OpenCL build failed: {str(err)[:2000]}") from None
        self.launches: List[dict] = []  # what the last call launched: kernel, grid, block
        self._kernels: Dict[str, object] = {}
        self._scratch: List[tuple] = []

    # buffers
    def _alloc(self, nbytes: int) -> _Buffer:
        import pyopencl as cl

        ctx = _device()[0]
        # the data region rounded up to whole 4-byte words (the NaN fill's unit); the guard after it starts at
        # the buffer's last byte, whatever its size (a uint8 tensor of odd length)
        words = max(1, -(-nbytes // 4))
        guard = np.full(words + 2 * GUARD_BYTES // 4, _NAN_WORD, np.uint32)
        mem = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=guard)
        return _Buffer(mem, mem.get_sub_region(GUARD_BYTES, 4 * words), nbytes)

    def _upload(self, array: np.ndarray, dtype: str) -> _Buffer:
        import pyopencl as cl

        host = np.ascontiguousarray(array).astype(_storage_dtype(dtype, self.widened))
        buf = self._alloc(host.nbytes)
        if host.nbytes:
            cl.enqueue_copy(self.queue, buf.view, host)
        return buf

    def _check_guards(self, buf: _Buffer, name: str) -> None:
        """Every byte outside the buffer's ``nbytes`` still holds the NaN fill (byte-exact: the bytes that round a
        buffer up to whole words count as after it)."""
        import pyopencl as cl

        total = 4 * (max(1, -(-buf.nbytes // 4)) + 2 * GUARD_BYTES // 4)
        fill = np.full(total // 4, _NAN_WORD, np.uint32).view(np.uint8)
        for where, start, stop in (("before", 0, GUARD_BYTES), ("after", GUARD_BYTES + buf.nbytes, total)):
            span = np.empty(stop - start, np.uint8)
            cl.enqueue_copy(self.queue, span, buf.mem, src_offset=start)
            if not (span == fill[start:stop]).all():
                raise AssertionError(f"a kernel wrote {where} the bounds of buffer '{name}'")

    def __call__(self, *arrays: np.ndarray, **scalars):
        import pyopencl as cl

        params = list(self.host.params)
        if len(arrays) + len(scalars) != len(params):
            raise TypeError(f"expected {len(params)} arguments, got {len(arrays) + len(scalars)}")
        env: dict = {}
        buffers: Dict[object, _Buffer] = {}
        outputs = []
        given = iter(arrays)
        for p in params:
            ty = p.ty
            if type(ty).__name__ != "BufferType":  # a scalar parameter (a symbolic size passed alone)
                env[p] = int(scalars[p.name]) if p.name in scalars else int(next(given))
                continue
            array = next(given)
            shape = list(ty.shape)
            if len(shape) != array.ndim:
                raise ValueError(f"'{p.name}' has {array.ndim} dimensions, the kernel {len(shape)}")
            for dim, size in zip(shape, array.shape):
                if isinstance(dim, tirx.IntImm):
                    if int(dim) != size:
                        raise ValueError(f"'{p.name}' is {list(array.shape)}, the kernel's {list(shape)}")
                elif type(dim).__name__ in ("Var", "SizeVar"):
                    if env.setdefault(dim, size) != size:
                        raise ValueError(f"'{p.name}': {dim} is {env[dim]} elsewhere, {size} here")
            buffers[p] = self._upload(array, str(ty.dtype))
            outputs.append((p, array, str(ty.dtype)))
        self.launches, self._scratch = [], []
        self._run(self.host.body, env, buffers)
        self.queue.finish()
        for p, array, dtype in outputs:
            buf = buffers[p]
            self._check_guards(buf, p.name)
            if array.flags.writeable and buf.nbytes:
                host = np.empty(array.shape, _storage_dtype(dtype, self.widened))
                cl.enqueue_copy(self.queue, host, buf.view)
                array[...] = host.astype(array.dtype) if self.widened else host.view(array.dtype)
        for name, buf in self._scratch:
            self._check_guards(buf, name)
        return None

    def _run(self, stmt, env, buffers) -> None:
        kind = type(stmt).__name__
        if kind == "SeqStmt":
            for s in stmt.seq:
                self._run(s, env, buffers)
        elif kind == "AllocBuffer":
            buf = stmt.buffer
            n = int(np.prod([_eval(d, env) for d in buf.shape], dtype=np.int64)) if len(buf.shape) else 1
            buffers[buf] = self._alloc(n * _itemsize(str(buf.dtype), self.widened))
            self._scratch.append((buf.name, buffers[buf]))
        elif kind == "DeclBuffer":
            buffers[stmt.buffer] = self._root(stmt.data, buffers)
        elif kind in ("LetStmt", "Bind"):
            env[stmt.var] = _eval(stmt.value, env)
            if getattr(stmt, "body", None) is not None:
                self._run(stmt.body, env, buffers)
        elif kind in ("AttrStmt",):
            self._run(stmt.body, env, buffers)
        elif kind == "AssertStmt":
            if not _eval(stmt.condition, env):
                raise AssertionError(f"host assertion failed: {stmt.condition}")
        elif kind == "IfThenElse":
            branch = stmt.then_case if _eval(stmt.condition, env) else stmt.else_case
            if branch is not None:
                self._run(branch, env, buffers)
        elif kind == "For":
            for i in range(_eval(stmt.min, env), _eval(stmt.min, env) + _eval(stmt.extent, env)):
                env[stmt.loop_var] = i
                self._run(stmt.body, env, buffers)
        elif kind == "Evaluate":
            self._launch(stmt.value, env, buffers)
        else:
            raise NotImplementedError(f"host statement {kind}")

    def _root(self, expr, buffers) -> _Buffer:
        if type(expr).__name__ == "Call" and expr.op.name == "tirx.buffer_data":
            return buffers[expr.args[0]]
        if expr in buffers:
            return buffers[expr]
        raise NotImplementedError(f"buffer data {expr}")

    def _launch(self, call, env, buffers) -> None:
        import pyopencl as cl

        if type(call).__name__ != "Call" or call.op.name != "tirx.call_ffi_kernel":
            if type(call).__name__ in ("IntImm",):
                return
            raise NotImplementedError(f"host call {call}")
        tags = [str(t) for t in call.attrs.launch_params] if hasattr(call.attrs, "launch_params") else None
        if tags is None:
            tags = [str(t) for t in call.attrs["launch_params"]]
        name = str(call.args[0].value)
        args = list(call.args[1:])
        extents = [_eval(e, env) for e in args[len(args) - len(tags):]]
        args = args[:len(args) - len(tags)]
        grid, block = [1, 1, 1], [1, 1, 1]
        for tag, extent in zip(tags, extents):
            if tag.startswith("blockIdx."):
                grid["xyz".index(tag[-1])] = extent
            elif tag.startswith("threadIdx."):
                block["xyz".index(tag[-1])] = extent
            else:
                raise NotImplementedError(f"launch parameter {tag} (dynamic shared memory) in {name}")
        self.launches.append({"kernel": name, "grid": grid, "block": block})
        if 0 in grid:
            return  # nothing to do at this size (an empty batch, no rows)
        values = []
        for a in args:
            if type(a).__name__ == "Call" and a.op.name == "tirx.buffer_data" or a in buffers:
                values.append(self._root(a, buffers).view)
            else:
                values.append(np.array(_eval(a, env), dtype=str(a.ty.dtype)))
        if name not in self._kernels:
            self._kernels[name] = cl.Kernel(self.program, name)
        kernel = self._kernels[name]
        kernel(self.queue, tuple(g * b for g, b in zip(grid, block)), tuple(block), *values)


# -- building -------------------------------------------------------------------------------------------------------
def schedule_prim(func: tirx.PrimFunc, rule: str, target: tvm.target.Target, knobs: Optional[dict] = None):
    """The module of ``func`` with its ``rule`` block scheduled by that rule's template for ``target``."""
    from tvm import s_tir

    from ..schedules.registry import get_template

    sch = s_tir.Schedule(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), seed=1)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    block = next(b for b in blocks if str(sch.get(b).annotations.get("schedule_rule", "")) == rule)
    template = get_template(rule, target)
    if template is None:
        raise LookupError(f"no template for {rule} on {target.kind.name}")
    (template.with_knobs(knobs) if knobs else template)(sch, block, target)
    return sch.mod


def is_kernel(func) -> bool:
    """Whether a scheduled PrimFunc launches GPU threads (else it is host code: shape functions and the like)."""
    return isinstance(func, tirx.PrimFunc) and "blockIdx." in func.script()


def emulate_relax(scheduled: tvm.IRModule, target: tvm.target.Target):
    """A Relax VM executable for this CPU that runs ``scheduled`` (a Relax module whose kernels were scheduled for
    ``target``, the OpenCL stand-in): each kernel call becomes a packed call to its :class:`OpenCLFunction`, the
    rest (shape arithmetic, reshapes, host PrimFuncs) is built for the CPU. Returns ``(executable, kernels)``."""
    from tvm import relax

    from ..compile.finalize import finalize
    from ..targets import host_cpu_target

    kernels: Dict[str, OpenCLFunction] = {}
    out = scheduled.clone()
    for gv, func in scheduled.functions_items():
        if is_kernel(func):
            name = f"tfx.simt_on_cpu.{next(_MODULES)}.{gv.name_hint}"  # unique: a VM binds packed names globally
            fn = OpenCLFunction(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
            kernels[gv.name_hint] = fn
            tvm.register_global_func(name, _packed(fn), override=True)
            kernels[gv.name_hint].packed_name = name

    @relax.expr_functor.mutator
    class _ToPacked(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if call.op.same_as(tvm.ir.Op.get("relax.call_tir")) and call.args[0].name_hint in kernels:
                fn = kernels[call.args[0].name_hint]
                args = list(call.args[1].fields)
                if len(call.args) > 2:  # symbolic sizes passed as scalars (tir_vars)
                    args.append(relax.ShapeExpr(list(call.args[2].values)))
                return relax.call_dps_packed(relax.ExternFunc(fn.packed_name), args, call.ty_args[0])
            return call

    for gv, func in out.functions_items():
        if isinstance(func, relax.Function):
            out[gv] = _ToPacked().visit_expr(func)
    for name in list(kernels):
        out = _remove(out, name)
    return finalize(out, host_cpu_target()), kernels


def _remove(mod: tvm.IRModule, name: str) -> tvm.IRModule:
    funcs = {gv: f for gv, f in mod.functions_items() if gv.name_hint != name}
    return tvm.IRModule(funcs, attrs=mod.attrs)


def _packed(fn: OpenCLFunction):
    """A packed function over TVM tensors (the VM's destination-passing call) running ``fn``."""

    def call(*args):
        arrays, scalars = [], []
        for a in args:
            if isinstance(a, tvm.runtime.Tensor):
                arrays.append(a)
            else:  # a ShapeTuple of symbolic sizes
                scalars.extend(int(v) for v in a)
        host = [a.numpy() for a in arrays]
        for h in host:
            h.setflags(write=True)
        fn(*host, *scalars)
        for a, h in zip(arrays, host):
            a.copyfrom(h)

    return call

