"""``tvm-fusion fuse MODEL.onnx [--json] [--remove-padding]``: the FusionReport of SemanticFusion on a model."""

from __future__ import annotations

import json

from .common import add_model_args, add_remove_padding_arg, load_model_arg


def cmd_fuse(args) -> int:
    from ..compile import fuse
    mod = load_model_arg(args)
    _, report = fuse(mod, remove_padding=args.remove_padding)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(f"{args.model}")
        print(report.summary())
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("fuse", help="run the fusion passes and print the FusionReport")
    add_model_args(p)
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    add_remove_padding_arg(p)
    p.set_defaults(func=cmd_fuse)
