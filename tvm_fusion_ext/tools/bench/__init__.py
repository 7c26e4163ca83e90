"""``tvm-fusion bench``: this package against ONNX Runtime, PyTorch eager and stock TVM, in one run.

=============  ====================================================================================
``model``      a whole ONNX model against the peers (:func:`bench_model`)
``artifact``   a compiled artifact, loaded as a deployment would, against the same peers (:func:`bench_artifact`)
``kernels``    the attention kernel alone (:func:`bench_attention`) and ``fused_dense`` alone
``decode``     one generation step of a KV-cache decoder vs ONNX Runtime and the memory limit (:func:`bench_decode`)
``gated``      a gated MLP's gate and up projections: fused_gated_dense vs without it vs torch (:func:`bench_gated`)
``peers``      how each peer is run, and thread settings that keep the comparison fair
``report``     tables, JSON, plot
=============  ====================================================================================
"""

from .artifact import ARTIFACT_RUNTIMES, bench_artifact
from .decode import bench_decode
from .gated import bench_gated
from .kernels import bench_attention, bench_dense, tir_allocation_bytes, workspace_bytes
from .model import DEFAULT_BATCH, DEFAULT_SEQ, bench_model, hf_export_info
from .peers import set_thread_spinning
from .report import ORT, OURS, RUNTIMES, STOCK, TORCH, Row, format_attention, format_table, plot, write_json

__all__ = ["ARTIFACT_RUNTIMES", "DEFAULT_BATCH", "DEFAULT_SEQ", "ORT", "OURS", "RUNTIMES", "Row", "STOCK", "TORCH",
           "bench_artifact", "bench_attention", "bench_decode", "bench_dense", "bench_gated", "bench_model", "format_attention", "format_table",
           "hf_export_info", "plot", "set_thread_spinning", "tir_allocation_bytes", "workspace_bytes", "write_json"]
