"""``tvm-fusion``: the command-line face of the package, one module per subcommand.

Every subcommand fails with one line (``error: ...``) and exit code 2 on bad input; ``--debug`` shows the
traceback for bug reports. Output files are written atomically, so a failed run leaves none behind.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from ..errors import CompilerMissingError, FusionExtError

EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 1

#: subcommand modules, in ``--help`` order; each has ``add_parser(subparsers)``
_COMMANDS = ("fuse", "compile", "info", "run", "generate", "demo", "bench", "tune", "inspect_cuda")


def tvm_can_compile() -> bool:
    """Whether this TVM has its compiler library (``libtvm_compiler.so``) loaded: a runtime-only TVM runs
    artifacts but cannot import, fuse, tune or build."""
    import tvm  # noqa: F401  (loads TVM's libraries, which register the global functions asked for below)
    import tvm_ffi

    return tvm_ffi.get_global_func("target.build.llvm", allow_missing=True) is not None


def needs_compiler(args) -> bool:
    """Whether the parsed command compiles: everything but ``info``, ``generate`` and ``run``/``bench`` on an
    artifact."""
    if args.command in ("info", "generate"):
        return False
    if args.command in ("run", "bench"):
        from ..deploy.manifest import is_artifact

        model = getattr(args, "model", None)
        return not (model is not None and is_artifact(model))
    return True


def require_compiler(args) -> None:
    """One line naming the cause when a compiling command meets a runtime-only TVM (instead of the
    AttributeError TVM's Python layer raises deep inside the importer)."""
    import os

    if not needs_compiler(args) or tvm_can_compile():
        return
    why = ("TVM_USE_RUNTIME_LIB=1 is set" if os.environ.get("TVM_USE_RUNTIME_LIB", "") not in ("", "0")
           else "libtvm_compiler.so is not installed")
    what = f"tvm-fusion {args.command}" + (" MODEL.onnx" if args.command in ("run", "bench") else "")
    raise CompilerMissingError(
        f"'{what}' compiles, which needs TVM's compiler library (libtvm_compiler.so), and this "
        f"TVM is runtime-only ({why}); compiled artifacts run runtime-only: `tvm-fusion run|bench|info ARTIFACT`")


def version_line() -> str:
    """This package's version and what it runs on: the versions an artifact's manifest checks at load, and whether
    this TVM can compile (a runtime-only TVM runs artifacts; ``compile``, ``tune`` and building need the compiler)."""
    import platform

    import tvm
    import tvm_ffi

    from .. import __version__

    kind = "with its compiler" if tvm_can_compile() else "runtime only: artifacts run, nothing compiles"
    return (f"tvm-fusion {__version__} (TVM {tvm.__version__}, {kind}; tvm-ffi {tvm_ffi.__version__}; "
            f"Python {platform.python_version()})")


class _VersionAction(argparse.Action):
    """``--version``: computed only when asked (it imports TVM), then exits like argparse's own."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="tvm-fusion", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action=_VersionAction,
                        help="print the package, TVM and tvm-ffi versions (and whether TVM can compile) and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _COMMANDS:
        importlib.import_module(f"{__name__}.{name}").add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        require_compiler(args)
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
