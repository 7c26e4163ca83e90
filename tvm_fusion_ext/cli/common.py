"""Argument helpers the subcommands share."""

from __future__ import annotations

import argparse
import os
from typing import Dict, List, Optional

from ..errors import InputError


def add_model_args(p: argparse.ArgumentParser, model_help: str = "ONNX model file") -> None:
    p.add_argument("model", help=model_help)
    p.add_argument("--shape", help="pin dynamic dims to a static build, e.g. input_ids:1x128,attention_mask:1x128 "
                                   "(without it they stay symbolic); a name may be a pattern: past_key_values.*:1x4x0x64")
    p.add_argument("--max-shape", help="upper bounds of the dynamic dims, same form as --shape (default: batch 64, "
                                       "sequence the position table's length when the graph shows one, else 512)")


def shapes_arg(args) -> Optional[Dict[str, List[int]]]:
    from ..frontend import parse_shape_arg

    return parse_shape_arg(args.shape) if getattr(args, "shape", None) else None


def max_shapes_arg(args) -> Optional[Dict[str, List[int]]]:
    from ..frontend import parse_shape_arg

    return parse_shape_arg(args.max_shape) if getattr(args, "max_shape", None) else None


def load_model_arg(args):
    """``load_onnx`` of the command's MODEL with its --shape / --max-shape."""
    from ..frontend import load_onnx

    return load_onnx(args.model, shapes=shapes_arg(args), max_shapes=max_shapes_arg(args))


def load_npz(path: str):
    import numpy as np

    if not os.path.exists(path):
        raise InputError(f"{path}: inputs file not found")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (ValueError, OSError, EOFError) as err:  # EOFError: an empty file
        raise InputError(f"{path}: not a readable .npz file ({str(err).splitlines()[0]})") from None


def add_precision_arg(p, only: str = "") -> None:
    # the names of compile/precision.py's PRECISIONS, not imported: building the parser must not load the
    # compiler (a runtime-only TVM runs `tvm-fusion run ARTIFACT`)
    p.add_argument("--precision", help=f"{only}what the dense kernels compute in: fp32 | bf16 | int8 "
                                       f"(default fp32; bf16: bf16 weights and activations, fp32 accumulation; "
                                       f"int8: dynamic quantisation, int32 accumulation)")


def add_remove_padding_arg(p) -> None:
    p.add_argument("--remove-padding", action=argparse.BooleanOptionalAction, default=False,
                   help="run token-wise operators on the valid tokens of attention_mask only (padding-free "
                        "variable-length batches; padded output positions are 0). Off by default")
