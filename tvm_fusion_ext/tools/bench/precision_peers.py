"""Reduced-precision peers for ``bench --against ort-int8,torch-bf16``.

``ort-int8``: ONNX Runtime on ``quantize_dynamic(per_channel=True)`` of the same file (int8 weights per output
channel, uint8 activations quantised per tensor at run time: MatMulInteger / DynamicQuantizeMatMul kernels).
``torch-bf16``: the transformers module under CPU bf16 autocast (oneDNN's bf16 GEMMs where the CPU has
AVX512_BF16/AMX, reference kernels elsewhere), when the file records which model it is.
Both are checked against ONNX Runtime's fp32 outputs like every other row.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from typing import Callable, Dict, Optional

import numpy as np

from ..timing import time_block
from .report import Row

ORT_INT8, TORCH_BF16 = "onnxruntime-int8", "torch-bf16"
#: ``--against`` entries beyond the default runtimes
LOW_PRECISION_RUNTIMES = ("ort-int8", "torch-bf16")


def ort_int8_row(path: str, feeds: Dict[str, np.ndarray], threads: int, spin: bool, repeat: int,
                 diff: Callable) -> Row:
    if importlib.util.find_spec("onnxruntime") is None:
        return Row(ORT_INT8, note="n/a (onnxruntime not installed)")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from .peers import ort_session

    with tempfile.TemporaryDirectory(prefix="tfx-ort-int8-") as tmp:
        quantized = os.path.join(tmp, "model.int8.onnx")
        quantize_dynamic(path, quantized, per_channel=True, weight_type=QuantType.QInt8)
        sess = ort_session(quantized, threads, spin=spin)
    names = {i.name for i in sess.get_inputs()}
    given = {k: v for k, v in feeds.items() if k in names}
    got = sess.run(None, given)
    return Row(ORT_INT8, time_block(ORT_INT8, lambda: sess.run(None, given), repeat=repeat), diff(got),
               note="per_channel=True, QInt8 weights", extra={"intra_op_threads": threads})


def torch_bf16_row(info: Optional[dict], feeds: Dict[str, np.ndarray], threads: int, repeat: int,
                   diff: Callable) -> Row:
    if info is None or "kind" not in info:
        return Row(TORCH_BF16, note="n/a (not a transformers export)")
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        return Row(TORCH_BF16, note="n/a (torch/transformers not installed)")
    import torch

    from .peers import torch_runner

    fp32_call = torch_runner(info, feeds, threads)

    def call():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fp32_call()

    got = call()
    return Row(TORCH_BF16, time_block(TORCH_BF16, call, repeat=repeat), diff([got.float().numpy()]),
               note=f"eager under torch.autocast('cpu', bfloat16), {info['kind']}", extra={"threads": threads})
