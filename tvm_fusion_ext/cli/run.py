"""``tvm-fusion run MODEL.onnx --inputs X.npz --output Y.npz``: build and run a model once."""

from __future__ import annotations

from ..fileio import atomic_write
from .common import add_model_args, load_model_arg, load_npz


def cmd_run(args) -> int:
    import numpy as np

    from ..deploy.io import check_inputs
    from ..dims import shape_bounds
    from ..frontend import input_specs
    from ..runtime import CompiledModel
    from ..targets import resolve_target

    inputs = load_npz(args.inputs)
    target = resolve_target(args.target)
    mod = load_model_arg(args)
    check_inputs(input_specs(mod), inputs, args.model, shape_bounds(mod))  # before the build: bad inputs fail in a second
    model = CompiledModel.from_module(mod, target, logs=args.logs, fuse=not args.no_fusion, label=args.model)
    if args.logs is not None:
        print(model.compiled.records_note)
    outputs = model.run(inputs)
    atomic_write(args.output, lambda f: np.savez(f, **outputs), binary=True)
    for name, value in outputs.items():
        print(f"{name}: shape {list(value.shape)} dtype {value.dtype}")
    print(f"wrote {args.output}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="build and run a model on inputs from an .npz file")
    add_model_args(p)
    p.add_argument("--inputs", required=True, help=".npz with one array per ONNX input name")
    p.add_argument("--output", required=True, help=".npz to write, one array per ONNX output name")
    p.add_argument("--target", default="llvm", help="llvm (default), cuda or cuda:sm_80 / cuda:sm_90")
    p.add_argument("--logs", help="tuning-log directory to apply")
    p.add_argument("--no-fusion", action="store_true", help="build without the fusion passes")
    p.set_defaults(func=cmd_run)
