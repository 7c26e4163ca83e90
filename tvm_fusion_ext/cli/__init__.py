"""``tvm-fusion``: the command-line face of the package, one module per subcommand.

Every subcommand fails with one line (``error: ...``) and exit code 2 on bad input; ``--debug`` shows the
traceback for bug reports. Output files are written atomically, so a failed run leaves none behind.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from ..errors import FusionExtError

EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 1

#: subcommand modules, in ``--help`` order; each has ``add_parser(subparsers)``
_COMMANDS = ("fuse", "compile", "info", "run", "demo", "bench", "tune", "inspect_cuda")


def version_line() -> str:
    """This package's version and what it runs on: the versions an artifact's manifest checks at load, and whether
    this TVM can compile (a runtime-only TVM runs artifacts; ``compile``, ``tune`` and building need the compiler)."""
    import platform

    import tvm
    import tvm_ffi

    from .. import __version__

    compiler = tvm_ffi.get_global_func("target.build.llvm", allow_missing=True) is not None
    kind = "with its compiler" if compiler else "runtime only: artifacts run, nothing compiles"
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
