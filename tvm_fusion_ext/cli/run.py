"""``tvm-fusion run MODEL --inputs X.npz --output Y.npz``: run a model once. ``MODEL`` is an ONNX file (built
here, then run) or an artifact directory from ``tvm-fusion compile`` (loaded and run with TVM's runtime only:
that branch imports nothing that compiles, so it works under ``TVM_USE_RUNTIME_LIB=1``)."""

from __future__ import annotations

from ..errors import InputError
from ..fileio import atomic_write
from .common import add_model_args, add_precision_arg, add_remove_padding_arg, load_npz

#: flags that only mean something when compiling (what an artifact has done already)
_COMPILE_FLAGS = (("--target", "target"), ("--logs", "logs"), ("--shape", "shape"), ("--max-shape", "max_shape"),
                  ("--no-fusion", "no_fusion"), ("--remove-padding", "remove_padding"), ("--precision", "precision"))


def cmd_run(args) -> int:
    from ..deploy.manifest import is_artifact

    inputs = load_npz(args.inputs)
    outputs = _run_artifact(args, inputs) if is_artifact(args.model) else _run_onnx(args, inputs)
    _write(args.output, outputs)
    return 0


def _run_artifact(args, inputs):
    from ..deploy import load

    given = [flag for flag, attr in _COMPILE_FLAGS if getattr(args, attr)]
    if given:
        raise InputError(f"{given[0]} applies when compiling; {args.model} is an artifact, compiled already "
                         f"(recompile with `tvm-fusion compile ... {given[0]}`)")
    return load(args.model).run(inputs)


def _run_onnx(args, inputs):
    from ..deploy.io import check_inputs
    from ..frontend.dims import bound_reasons, shape_bounds
    from ..frontend import input_specs
    from ..runtime import CompiledModel
    from ..targets import resolve_target
    from ..compile.calibration import default_calibration
    from .common import load_model_arg, shapes_arg

    target = resolve_target(args.target or "llvm")
    mod = load_model_arg(args)
    # before the build: bad inputs fail fast
    check_inputs(input_specs(mod), inputs, args.model, shape_bounds(mod), bound_reasons(mod))
    precision = args.precision or "fp32"
    model = CompiledModel.from_module(mod, target, logs=args.logs, fuse=not args.no_fusion, label=args.model,
                                      remove_padding=args.remove_padding, precision=precision,
                                      calibration=default_calibration(args.model, precision, shapes_arg(args)))
    if args.logs is not None:
        print(model.compiled.records_note)
    return model.run(inputs)


def _write(path: str, outputs) -> None:
    import numpy as np

    atomic_write(path, lambda f: np.savez(f, **outputs), binary=True)
    for name, value in outputs.items():
        print(f"{name}: shape {list(value.shape)} dtype {value.dtype}")
    print(f"wrote {path}")


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run a model (ONNX file, built here, or artifact directory) on inputs from an "
                                   ".npz file")
    add_model_args(p, "ONNX model file, or an artifact directory from `tvm-fusion compile`")
    p.add_argument("--inputs", required=True, help=".npz with one array per ONNX input name")
    p.add_argument("--output", required=True, help=".npz to write, one array per ONNX output name")
    p.add_argument("--target", help="ONNX file only: llvm (default), cuda or cuda:sm_80 / cuda:sm_90")
    p.add_argument("--logs", help="ONNX file only: tuning-log directory to apply")
    p.add_argument("--no-fusion", action="store_true", help="ONNX file only: build without the fusion passes")
    add_remove_padding_arg(p)
    add_precision_arg(p, "ONNX file only: ")
    p.set_defaults(func=cmd_run)
