"""``tvm-fusion inspect-cuda``: per-kernel CUDA resources of a model (see :mod:`tvm_fusion_ext.tools.inspect_cuda`)."""

from __future__ import annotations

import json
from typing import List, Optional

from ..tools.inspect_cuda import DTYPES, format_table, inspect_cuda
from .common import add_precision_arg, shapes_arg


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("inspect-cuda", help="per-kernel CUDA registers / smem / spills (no GPU needed)",
                              description="Build MODEL for a CUDA architecture with nvcc and report each kernel's "
                                          "registers, shared memory, stack, spills, block size and tensor-core use.")
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("--arch", default="sm_90", help="CUDA architecture: sm_80 or sm_90 (default sm_90)")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="compute dtype (default float32)")
    add_precision_arg(p, "with --dtype float32: ")
    p.add_argument("--shape", help="pin dynamic dims to a static build, e.g. input_ids:1x16,"
                                   "past_key_values.*:1x2x16x16 (tensor-core denses need static rows; without it "
                                   "the dims stay symbolic)")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.set_defaults(func=_run)


def _run(args) -> int:
    rows = inspect_cuda(args.model, arch=args.arch, dtype=args.dtype, precision=args.precision,
                        shapes=shapes_arg(args))
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))
    return 0


def main(argv: Optional[List[str]] = None) -> int:  # handy for `python -m tvm_fusion_ext.cli.inspect_cuda`
    import argparse

    parser = argparse.ArgumentParser(prog="tvm_fusion_ext")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)



if __name__ == "__main__":
    raise SystemExit(main())
