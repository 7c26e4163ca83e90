"""``inspect-cuda``: what each CUDA kernel of a model costs in registers, shared memory, stack and spills.

No GPU is needed: the model goes through the normal build path (fusion, lowering, our templates, dlight for
the rest), and the generated CUDA source is compiled by ``nvcc`` once, for the requested architecture, with
``-Xptxas -v`` (per-kernel resources) and ``--keep`` (the PTX, to tell whether a kernel issues tensor-core
instructions), with the flags TVM itself passes to nvcc.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from typing import Dict, List

from ..errors import FusionExtError, TargetError

ARCHS = ("sm_80", "sm_90")
DTYPES = ("float32", "float16")
FIELDS = ("name", "registers", "smem_bytes", "stack_bytes", "spill_bytes", "threads_per_block", "tensor_core",
          "decode")

_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_TC = re.compile(r"^\s*(?:@!?%p\d+\s+)?(mma\.sync|wmma\.|wgmma\.)", re.M)
_PTX_ENTRY = re.compile(r"^\.visible \.entry (\w+)\(", re.M)
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\((\d+)\)\s*(\w+)\(")
_DECODE_BUFFER = re.compile(r"\bdec_(split|merge|kt|vt|q|qk|p|bo|bsum|bmax)\w*")


class CudaToolchainError(FusionExtError):
    """nvcc is missing or rejected the generated code."""


def _arch_suffix(arch: str) -> str:
    m = re.match(r"^sm_(\d{2,3}a?)$", arch)
    if not m:
        raise TargetError(f"unknown CUDA architecture '{arch}' (expected one of {', '.join(ARCHS)})")
    return m.group(1)


def nvcc_available() -> bool:
    return shutil.which("nvcc") is not None


def compile_cuda_source(src: str, arch: str, fmt: str = "cubin") -> tuple:
    """Compile ``src`` with nvcc as TVM would; returns (binary bytes, ptxas log, ptx text)."""
    if not nvcc_available():
        raise CudaToolchainError("nvcc is not on PATH (needed to compile CUDA kernels)")
    suffix = _arch_suffix(arch)
    with tempfile.TemporaryDirectory(prefix="tfx_nvcc_") as tmp:
        cu = os.path.join(tmp, "k.cu")
        out = os.path.join(tmp, f"k.{fmt}")
        with open(cu, "w") as f:
            f.write(src)
        # Same flags as tvm.support.nvcc (fast math, half/bf16 operators), plus the resource report and --keep
        # for the PTX of this very compile.
        cmd = ["nvcc", f"--{fmt}", "-O3", f"-arch=sm_{suffix}", "-w", "-Xptxas", "-v", "--keep",
               f"--keep-dir={tmp}", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
               "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
               "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
               "--expt-relaxed-constexpr", "--use_fast_math", "-o", out, cu]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0:
            first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:200])
            raise CudaToolchainError(f"nvcc failed for {arch}: {first}")
        ptx = ""
        for name in os.listdir(tmp):
            if name.endswith(".ptx"):
                with open(os.path.join(tmp, name)) as f:
                    ptx += f.read()
        with open(out, "rb") as f:
            binary = f.read()
    return binary, proc.stdout + proc.stderr, ptx


def parse_ptxas(log: str) -> Dict[str, dict]:
    """Per-kernel resources from ``-Xptxas -v`` output."""
    kernels: Dict[str, dict] = {}
    cur = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            cur = kernels.setdefault(m.group(1), {"registers": 0, "smem_bytes": 0, "stack_bytes": 0,
                                                  "spill_bytes": 0})
        elif cur is not None and (m := _STACK.search(line)):
            cur["stack_bytes"] = int(m.group(1))
            cur["spill_bytes"] = int(m.group(2)) + int(m.group(3))
        elif cur is not None and (m := _REGS.search(line)):
            cur["registers"] = int(m.group(1))
            if s := _SMEM.search(line):
                cur["smem_bytes"] = int(s.group(1))
    return kernels


def tensor_core_kernels(ptx: str) -> Dict[str, bool]:
    """Kernel name -> whether its PTX body issues mma.sync / wmma / wgmma."""
    out: Dict[str, bool] = {}
    starts = [(m.start(), m.group(1)) for m in _PTX_ENTRY.finditer(ptx)]
    for n, (pos, name) in enumerate(starts):
        end = starts[n + 1][0] if n + 1 < len(starts) else len(ptx)
        out[name] = bool(_TC.search(ptx, pos, end))
    return out


def threads_per_block(src: str) -> Dict[str, int]:
    """TVM stamps every kernel with ``__launch_bounds__(threads)``: the block size it launches with."""
    return {name: int(n) for n, name in _LAUNCH_BOUNDS.findall(src)}


def decode_kernels(src: str) -> Dict[str, bool]:
    """Kernel name -> whether it is one of the split-K decode attention's (``ops/decode_attention.py``: its body
    names the decode stages' buffers, ``dec_*``): a symbolic attention's one-row branch, or a static one-row
    attention."""
    starts = [(m.start(), m.group(2)) for m in _LAUNCH_BOUNDS.finditer(src)]
    out: Dict[str, bool] = {}
    for n, (pos, name) in enumerate(starts):
        end = starts[n + 1][0] if n + 1 < len(starts) else len(src)
        out[name] = bool(_DECODE_BUFFER.search(src, pos, end))
    return out


def kernel_report(src: str, arch: str) -> List[dict]:
    """Compile one CUDA source and describe each of its kernels (fields :data:`FIELDS`)."""
    _, log, ptx = compile_cuda_source(src, arch)
    return _rows(src, log, ptx)


def _rows(src: str, log: str, ptx: str) -> List[dict]:
    res = parse_ptxas(log)
    tc = tensor_core_kernels(ptx)
    threads = threads_per_block(src)
    decode = decode_kernels(src)
    rows = []
    for name, r in res.items():
        rows.append({"name": name, **r, "threads_per_block": threads.get(name, 0), "tensor_core": tc.get(name, False),
                     "decode": decode.get(name, False)})
    return rows


def cuda_sources(executable) -> List[str]:
    """The CUDA C++ of every device module under a built executable (TVM compiles them lazily)."""
    root = getattr(executable, "mod", executable)
    out, stack = [], [root]
    while stack:
        m = stack.pop()
        if m.kind == "cuda":
            out.append(m.inspect_source())
        stack.extend(m.imports)
    return out


# ------------------------------------------------------------------------------------------- the model report

def convert_dtype(mod, dtype: str):
    """The model with every float32 tensor in ``dtype``: constants (weights) cast at compile time, float
    parameters retyped, ``astype(float32)`` retargeted. Our fused operators still accumulate in fp32."""
    if dtype == "float32":
        return mod
    if dtype not in DTYPES:
        raise FusionExtError(f"unsupported dtype '{dtype}' (use one of {', '.join(DTYPES)})")
    return _cast_floats(mod, dtype)


def _cast_floats(mod, dtype: str):
    import numpy as np
    import tvm
    from tvm import relax

    astype = tvm.ir.Op.get("relax.astype")

    def cast_arg(arg):
        if isinstance(arg, tvm.ir.GenericConst) and str(arg.ty.dtype) == "float32":
            return relax.const(arg.value.numpy().astype(np.dtype(dtype)), dtype)
        return arg

    @relax.expr_functor.mutator
    class _Cast(relax.PyExprMutator):
        def visit_call_(self, call):
            # Cast the constants before the call is re-normalised: its type inference needs both sides cast.
            args = [cast_arg(self.visit_expr(a)) for a in call.args]
            if isinstance(call.op, tvm.ir.Op) and call.op.same_as(astype) and str(call.attrs.dtype) == "float32":
                return relax.op.astype(args[0], dtype)
            if all(a.same_as(b) for a, b in zip(args, call.args)):
                return call
            return relax.Call(call.op, args, call.attrs, call.ty_args)

    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    for gv, func in list(mod.functions_items()):
        if not isinstance(func, relax.Function):
            continue
        params, casts = [], {}
        for p in func.params:
            if isinstance(p.ty, relax.TensorType) and str(p.ty.dtype) == "float32":
                new = relax.Var(p.name, relax.TensorType(p.ty.shape, dtype))
                params.append(new)
                casts[p] = new
            else:
                params.append(p)
        # the body still names the old parameters; the mutator maps each use to its retyped replacement
        new_func = relax.Function(params, func.body, None, func.is_pure, func.attrs)
        mutator = _Cast(out)
        for old, new in casts.items():
            mutator.set_var_remap(old, new)
        out[gv] = mutator.visit_expr(new_func)
    return relax.transform.Normalize()(out)


def inspect_cuda(model_path: str, arch: str = "sm_90", dtype: str = "float32", precision: str = "fp32",
                 shapes=None) -> List[dict]:
    """Per-kernel CUDA resources of ``model_path`` built for ``arch`` in ``dtype`` (no GPU needed).

    One row per distinct kernel (layers of the same shape share their kernels). ``precision``: the dense kernels'
    (:mod:`~tvm_fusion_ext.compile.precision`; ``int8`` quantises fp32 weights, so it takes ``dtype`` float32).
    ``shapes``: dynamic dims pinned by ONNX input name, as :func:`~tvm_fusion_ext.frontend.load_onnx` takes them
    (the tensor-core paths need static rows: a dynamic export's denses are SIMT without them)."""
    from ..compile import build
    from ..frontend import load_onnx
    from ..targets import cuda_target

    if arch not in ARCHS and not re.match(r"^sm_\d{2,3}a?$", arch):
        raise TargetError(f"unknown CUDA architecture '{arch}' (expected one of {', '.join(ARCHS)})")
    target = cuda_target(arch)
    from ..compile.precision import check_precision

    precision = check_precision(precision)
    if precision != "fp32" and dtype != "float32":
        raise FusionExtError(f"precision {precision} quantises a float32 model's weights: use it with dtype "
                             f"float32, not {dtype}")
    if not nvcc_available():
        raise CudaToolchainError("nvcc is not on PATH (needed to compile CUDA kernels)")
    mod = load_onnx(model_path, shapes=shapes)
    mod = convert_dtype(mod, dtype)
    # nvrtc (TVM's default) needs the cuda-python bindings; nvcc is what we compile with anyway
    mode = os.environ.get("TVM_CUDA_COMPILE_MODE")
    os.environ["TVM_CUDA_COMPILE_MODE"] = mode or "nvcc"
    try:
        ex = build(mod, target, precision=precision)
    finally:
        if mode is None:
            del os.environ["TVM_CUDA_COMPILE_MODE"]
    rows = [row for src in cuda_sources(ex) for row in kernel_report(src, arch)]
    if not rows:
        raise CudaToolchainError("the build produced no CUDA kernels")
    return sorted(rows, key=lambda r: r["name"])


def format_table(rows: List[dict]) -> str:
    head = ("kernel", "regs", "smem", "stack", "spill", "threads", "tensor core", "decode")
    body = [(r["name"], str(r["registers"]), str(r["smem_bytes"]), str(r["stack_bytes"]), str(r["spill_bytes"]),
             str(r["threads_per_block"]), "yes" if r["tensor_core"] else "no",
             "yes" if r.get("decode") else "no") for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(b) for b in body])
