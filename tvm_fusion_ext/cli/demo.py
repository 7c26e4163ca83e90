"""``tvm-fusion demo``: the walkthrough on the built-in encoder (and all-MiniLM-L6-v2 when installed)."""

from __future__ import annotations


def cmd_demo(args) -> int:
    from ..tools.demo import run_demo

    run_demo(logs=args.logs, include_minilm=not args.no_minilm)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="fusion report, build, check against ONNX Runtime and time, on built-in models")
    p.add_argument("--logs", help="tuning-log directory to apply (default: the shipped tuning_logs/)")
    p.add_argument("--no-minilm", action="store_true", help="only the built-in tiny encoder")
    p.set_defaults(func=cmd_demo)
