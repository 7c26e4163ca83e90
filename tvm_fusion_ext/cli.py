"""``tvm-fusion``: the command-line face of the package.

Every subcommand fails with one line (``error: ...``) and a non-zero exit on bad input; ``--debug`` shows
the traceback for bug reports. Output files are written atomically, so a failed run leaves none behind.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Optional

from .errors import FusionExtError, InputError
from .fileio import atomic_write

EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 1


# ---------------------------------------------------------------------------------------------------------
# subcommands
# ---------------------------------------------------------------------------------------------------------

def cmd_fuse(args) -> int:
    from .api import fuse
    from .frontend import load_onnx

    mod = load_onnx(args.model, shapes=_shapes(args))
    _, report = fuse(mod)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(f"{args.model}")
        print(report.summary())
    return 0


def cmd_run(args) -> int:
    import numpy as np

    from .frontend import input_specs, load_onnx
    from .runtime import CompiledModel, check_inputs
    from .targets import resolve_target

    inputs = _load_npz(args.inputs)
    target = resolve_target(args.target)
    mod = load_onnx(args.model, shapes=_shapes(args))
    check_inputs(input_specs(mod), inputs, args.model)  # before the build: bad inputs fail in a second
    model = CompiledModel.from_module(mod, target, logs=args.logs, fuse=not args.no_fusion, label=args.model)
    outputs = model.run(inputs)
    atomic_write(args.output, lambda f: np.savez(f, **outputs), binary=True)
    for name, value in outputs.items():
        print(f"{name}: shape {list(value.shape)} dtype {value.dtype}")
    print(f"wrote {args.output}")
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    run_demo(logs=args.logs, include_minilm=not args.no_minilm)
    return 0


# ---------------------------------------------------------------------------------------------------------
# helpers shared by subcommands
# ---------------------------------------------------------------------------------------------------------

def _shapes(args) -> Optional[Dict[str, List[int]]]:
    from .frontend import parse_shape_arg

    return parse_shape_arg(args.shape) if getattr(args, "shape", None) else None


def _load_npz(path: str):
    import numpy as np

    if not os.path.exists(path):
        raise InputError(f"{path}: inputs file not found")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (ValueError, OSError) as err:
        raise InputError(f"{path}: not a readable .npz file ({str(err).splitlines()[0]})") from None


# ---------------------------------------------------------------------------------------------------------
# parser
# ---------------------------------------------------------------------------------------------------------

def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="ONNX model file")
    p.add_argument("--shape", help="static input shapes for dynamic dims, e.g. input_ids:1x128,attention_mask:1x128")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tvm-fusion", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("fuse", help="run the fusion passes and print the FusionReport")
    _add_model_args(p)
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=cmd_fuse)

    p = sub.add_parser("run", help="build and run a model on inputs from an .npz file")
    _add_model_args(p)
    p.add_argument("--inputs", required=True, help=".npz with one array per ONNX input name")
    p.add_argument("--output", required=True, help=".npz to write, one array per ONNX output name")
    p.add_argument("--target", default="llvm", help="llvm (default), cuda or cuda:sm_80 / cuda:sm_90")
    p.add_argument("--logs", help="tuning-log directory to apply")
    p.add_argument("--no-fusion", action="store_true", help="build without the fusion passes")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("demo", help="fusion report, build, check against ONNX Runtime and time, on built-in models")
    p.add_argument("--logs", help="tuning-log directory to apply (default: the shipped tuning_logs/)")
    p.add_argument("--no-minilm", action="store_true", help="only the built-in tiny encoder")
    p.set_defaults(func=cmd_demo)

    from . import bench

    bench.add_parser(sub)

    from . import inspect_cuda
    from .tune import cli as tune_cli

    tune_cli.add_parser(sub)
    inspect_cuda.add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except FusionExtError as err:
        if args.debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001  (the last line of defence: one line, not a TVM traceback)
        if args.debug:
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        print(f"error: internal error in '{args.command}': {type(err).__name__}: {first} "
              f"(rerun with --debug for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
