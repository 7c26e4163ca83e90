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
_COMMANDS = ("fuse", "compile", "run", "demo", "bench", "tune", "inspect_cuda")


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="tvm-fusion", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
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
