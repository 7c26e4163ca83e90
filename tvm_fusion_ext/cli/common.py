"""Argument helpers the subcommands share."""

from __future__ import annotations

import argparse
import os
from typing import Dict, List, Optional

from ..errors import InputError


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="ONNX model file")
    p.add_argument("--shape", help="static input shapes for dynamic dims, e.g. input_ids:1x128,attention_mask:1x128")


def shapes_arg(args) -> Optional[Dict[str, List[int]]]:
    from ..frontend import parse_shape_arg

    return parse_shape_arg(args.shape) if getattr(args, "shape", None) else None


def load_npz(path: str):
    import numpy as np

    if not os.path.exists(path):
        raise InputError(f"{path}: inputs file not found")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (ValueError, OSError) as err:
        raise InputError(f"{path}: not a readable .npz file ({str(err).splitlines()[0]})") from None
