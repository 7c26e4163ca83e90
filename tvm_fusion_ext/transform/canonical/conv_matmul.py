"""``conv1d`` / ``conv2d`` (+ a per-channel bias) → gather the patches, then one ``matmul`` (+ bias).

A convolution is a matrix product of its input patches with the flattened filters. TVM's stock conv kernels,
scheduled by the generic fallback, run at a few GFLOP/s on CPU, and the Transformers that have one put it where it
is large: ViT's 16×16 patch embedding (89 ms of a 2-layer ViT-B's 166 ms), Whisper's two audio convolutions
(680 of 790 ms), wav2vec2's feature encoder (seconds). As a matmul the product is the dense template's GEMM; the
patches are gathered once (``take`` with a computed index: one copy of the input per filter tap, and none at all
where the filter tiles the input, as a patch embedding does).

Pattern
    ``conv1d(x, w)`` or ``conv2d(x, w)``, optionally under ``add(conv, b)`` with ``b`` a constant (or a constant
    reshaped: the ONNX importer's ``[1, O, 1, 1]`` bias) that varies along the channel axis only.
Check (a reason says what keeps the stock kernel)
    layouts NCW/OIW or NCHW/OIHW, a float dtype with no other ``out_dtype``, a constant filter (:func:`conv_reason`);
    groups of at least :data:`MIN_GROUP_OUTPUTS` output channels (a grouped filter is one matmul per group; a
    depthwise one would be matrix-vector products); a static width (and height) of the input for conv2d (conv1d's
    length may be symbolic: an audio export's); the gathered patches at most :data:`MAX_PATCH_BYTES` when their size
    is known.
Rewrite
    conv1d (ungrouped): ``take`` of whole rows of ``pad(x)`` transposed to ``[N, L, C]`` → ``[N, P, taps·C]``
    (:meth:`ConvAsMatmul._conv1d_channels_last`). Otherwise ``take(pad(x)_flattened, index, axis=2)`` with
    ``index[p, t]`` the flat input position of output position ``p``'s tap ``t`` (a constant, or ``arange``s for a
    symbolic length), permuted and reshaped to ``[N, P, C·taps]``. Then ``matmul`` with the filters as a
    ``[C·taps, O]`` constant; ``+ b``; permuted back to ``[N, O, ...]``. The dense rule then reads ``matmul + add``
    as ``fused_dense``. Grouped: ``[N, G, P, Cg·taps]`` times ``[G, Cg·taps, Og]``, a batched matmul.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import tvm
from tvm import relax

from ..graph import FunctionGraph, const_value, explicit_out_dtype, is_constant, op_name, shape_dims, static_shape
from ..rule import Found, FusionRule, Match, Matcher, Variant

CONV_OPS = ("relax.nn.conv1d", "relax.nn.conv2d")
#: the gathered patches of one call, at most (above it the stock kernel's lower memory wins)
MAX_PATCH_BYTES = 512 << 20
#: output channels per group, at least, for a grouped convolution (wav2vec2's positional conv: 16 groups of 48)
MIN_GROUP_OUTPUTS = 8
_LAYOUTS = {"relax.nn.conv1d": ("NCW", "OIW"), "relax.nn.conv2d": ("NCHW", "OIHW")}


def int_list(arr) -> List[int]:
    return [int(v) for v in arr]


class _ConvMatcher(Matcher):
    """At ``add(conv, b)`` (``with_bias``) or at the conv itself."""

    def __init__(self, with_bias: bool):
        self.with_bias = with_bias

    def match(self, root: relax.Var, graph: FunctionGraph) -> Optional[Found]:
        value = graph.var2val[root]
        if not self.with_bias:
            if op_name(value) not in CONV_OPS:
                return None
            return Found({"x": value.args[0], "w": value.args[1], "conv": value})
        if op_name(value) != "relax.add":
            return None
        for conv_var, bias in (value.args, value.args[::-1]):
            conv = graph.value(conv_var)
            b = _constant(graph, bias)
            if isinstance(conv_var, relax.Var) and op_name(conv) in CONV_OPS and b is not None:
                return Found({"x": conv.args[0], "w": conv.args[1], "conv": conv, "bias": b}, covered=[conv_var])
        return None


def _constant(graph: FunctionGraph, e) -> Optional[np.ndarray]:
    """The value of a constant, or of a constant reshaped (the ONNX importer's ``[1, O, 1, 1]`` bias), else None."""
    value = graph.value(e)
    if is_constant(value):
        return const_value(value)
    if op_name(value) in ("relax.reshape", "relax.expand_dims") and is_constant(graph.value(value.args[0])):
        shape = static_shape(value)
        inner = const_value(graph.value(value.args[0]))
        return None if shape is None or inner is None or inner.size != int(np.prod(shape)) else inner.reshape(shape)
    return None


def channel_bias(b: np.ndarray, out_channels: int, rank: int) -> Optional[np.ndarray]:
    """``b`` as a vector of the output channels, if it varies along the channel axis only (else None)."""
    if b.ndim > rank:
        return None
    shape = (1,) * (rank - b.ndim) + tuple(b.shape)
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, out_channels):
        return None
    return np.broadcast_to(b.reshape(shape).reshape(-1), (out_channels,)).copy()


def conv_variants() -> List[Variant]:
    """A convolution, with or without the importer's bias ``add`` over it (this rule's and the depthwise one's)."""
    return [Variant(_ConvMatcher(with_bias=True), root_op="relax.add"),
            Variant(_ConvMatcher(with_bias=False), root_op="relax.nn.conv1d"),
            Variant(_ConvMatcher(with_bias=False), root_op="relax.nn.conv2d")]


def conv_reason(m: Match) -> Optional[str]:
    """Why a matched convolution is not one the rewrites read (channels-first layouts, a float dtype kept by the
    output, a constant filter), or None."""
    conv = m["conv"]
    op, a = op_name(conv), conv.attrs
    data_layout, kernel_layout = _LAYOUTS[op]
    if str(a.data_layout) != data_layout or str(a.kernel_layout) != kernel_layout or \
            str(a.out_layout) != data_layout:
        return f"{op} layouts {a.data_layout}/{a.kernel_layout}/{a.out_layout}, not {data_layout}/{kernel_layout}"
    dtype = m.dtype("x")
    out_dtype = explicit_out_dtype(conv) or dtype
    if dtype not in ("float32", "float16", "bfloat16") or out_dtype != dtype or m.dtype("w") != dtype:
        return f"{op} of {dtype} x {m.dtype('w')} into {out_dtype} (float in, the same float out)"
    if m.const("w") is None:
        return f"{op}'s filter is computed at run time"
    return None


class ConvRewrite(FusionRule):
    """A rewrite of a convolution (and its bias): the pattern and the checks every such rewrite needs
    (:func:`conv_reason`); a subclass adds its own in ``check_conv``."""

    kind = "canonical"

    def variants(self) -> List[Variant]:
        return conv_variants()

    def check(self, m: Match) -> Optional[str]:
        return conv_reason(m) or self.check_conv(m, op_name(m["conv"]), m["conv"].attrs)

    def check_conv(self, m: Match, op: str, a) -> Optional[str]:
        return None


class ConvAsMatmul(ConvRewrite):
    name = "ConvAsMatmul"

    def check_conv(self, m: Match, op: str, a) -> Optional[str]:
        conv = m["conv"]
        groups = int(a.groups)
        w = m.const("w")
        if groups != 1 and w.shape[0] // groups < MIN_GROUP_OUTPUTS:
            return f"{op} has {groups} groups of {w.shape[0] // groups} output channels (a depthwise-like " \
                   f"filter: a matmul per group would be a matrix-vector product)"
        dtype = m.dtype("x")
        x = m.dims("x")
        if x is None or len(x) != len(w.shape):
            return f"{op}'s input shape is unknown"
        spatial = x[2:]
        if op == "relax.nn.conv2d" and not all(isinstance(d, int) for d in spatial):
            return f"{op} of a symbolic image size {x}"
        if not isinstance(x[1], int) or x[1] != w.shape[1] * groups:
            return f"{op}: input channels {x[1]} against the filter's {w.shape[1]} × {groups} groups"
        if m.has("bias") and channel_bias(m["bias"], w.shape[0], len(x)) is None:
            return f"{op}'s bias of shape {m['bias'].shape} varies along other axes than the channels"
        out = shape_dims(conv)
        if out is not None and all(isinstance(d, int) for d in out):
            taps = int(np.prod(w.shape[2:]))
            patches = int(np.prod(out)) // w.shape[0] * x[1] * taps * np.dtype(
                "float32" if dtype == "float32" else "float16").itemsize
            if patches > MAX_PATCH_BYTES:
                return f"{op}'s patches would take {patches >> 20} MiB (more than {MAX_PATCH_BYTES >> 20})"
        return None

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        conv = m["conv"]
        a = conv.attrs
        w = m.const("w")
        groups = int(a.groups)
        out_channels, group_channels, *kernel = w.shape
        channels = group_channels * groups
        x = m.arg("x")
        dims = m.dims("x")
        rank = len(dims)
        strides, dilation, padding = int_list(a.strides), int_list(a.dilation), int_list(a.padding)
        spatial_rank = rank - 2
        if spatial_rank == 1 and groups == 1:
            return self._conv1d_channels_last(m, bb, x, w, strides, dilation, padding)
        # relax pads (before..., after...) per spatial axis
        before, after = padding[:spatial_rank], padding[spatial_rank:]
        if any(padding):
            pad_width = [0, 0, 0, 0]
            for i in range(spatial_rank):
                pad_width += [before[i], after[i]]
            x = bb.emit(relax.op.nn.pad(x, pad_width))
        padded = [d + before[i] + after[i] for i, d in enumerate(dims[2:])]
        out_dims = shape_dims(conv)[2:]
        if spatial_rank == 2:
            x = bb.emit(relax.op.reshape(x, [dims[0], channels, padded[0] * padded[1]]))
        index = self._index(bb, out_dims, kernel, strides, dilation, padded)
        taps = int(np.prod(kernel))
        patches = bb.emit(relax.op.take(x, index, axis=2, mode="clip"))          # [N, C, P, taps]
        positions = out_dims[0] if spatial_rank == 1 else out_dims[0] * out_dims[1]
        bias = channel_bias(m["bias"], out_channels, rank).astype(w.dtype) if m.has("bias") else None
        if groups == 1:
            patches = bb.emit(relax.op.permute_dims(patches, [0, 2, 1, 3]))       # [N, P, C, taps]
            patches = bb.emit(relax.op.reshape(patches, [dims[0], positions, channels * taps]))
            filters = relax.const(np.ascontiguousarray(w.reshape(out_channels, channels * taps).T))
            y = bb.emit(relax.op.matmul(patches, filters))                        # [N, P, O]
            if bias is not None:
                y = bb.emit(relax.op.add(y, relax.const(bias)))
            y = bb.emit(relax.op.permute_dims(y, [0, 2, 1]))                      # [N, O, P]
        else:  # one product per group: [N, G, P, Cg·taps] x [G, Cg·taps, Og]
            outputs = out_channels // groups
            patches = bb.emit(relax.op.reshape(patches, [dims[0], groups, group_channels, positions, taps]))
            patches = bb.emit(relax.op.permute_dims(patches, [0, 1, 3, 2, 4]))    # [N, G, P, Cg, taps]
            patches = bb.emit(relax.op.reshape(patches, [dims[0], groups, positions, group_channels * taps]))
            filters = w.reshape(groups, outputs, group_channels * taps).transpose(0, 2, 1)
            y = bb.emit(relax.op.matmul(patches, relax.const(np.ascontiguousarray(filters))))  # [N, G, P, Og]
            if bias is not None:
                y = bb.emit(relax.op.add(y, relax.const(bias.reshape(groups, 1, outputs))))
            y = bb.emit(relax.op.permute_dims(y, [0, 1, 3, 2]))                   # [N, G, Og, P]
            y = bb.emit(relax.op.reshape(y, [dims[0], out_channels, positions]))
        if spatial_rank == 1:
            return y
        return relax.op.reshape(y, [dims[0], out_channels, *out_dims])

    @staticmethod
    def _conv1d_channels_last(m: Match, bb: relax.BlockBuilder, x, w, strides, dilation, padding) -> relax.Expr:
        """conv1d: the patch of output position p is the taps' rows of the channels-last input,
        ``concat_t(x_nwc[p·s + t·d, :])``: a ``take`` of whole rows, each read contiguously. An audio encoder's NCW
        activations are a transpose of the previous conv's matmul rows (wav2vec2's feature encoder: conv, GELU,
        conv, ...): FuseOps then joins that transpose, the GELU and this transpose back into one elementwise kernel
        over the rows, where gathering across the NCW tensor needed a strided gather and a transpose of the patches
        (wav2vec2-base: 104-132 ms a call before, 80 after, 2 threads)."""
        conv = m["conv"]
        out_channels, channels, taps = w.shape
        length = shape_dims(conv)[2]
        rows = bb.emit(relax.op.permute_dims(x, [0, 2, 1]))                      # [N, L, C]
        if any(padding):
            rows = bb.emit(relax.op.nn.pad(rows, [0, 0, padding[0], padding[1], 0, 0]))
        padded = [m.dims("x")[2] + padding[0] + padding[1]]
        index = ConvAsMatmul._index(bb, [length], [taps], strides, dilation, padded)
        patches = bb.emit(relax.op.take(rows, index, axis=1, mode="clip"))       # [N, L_out, taps, C]
        patches = bb.emit(relax.op.reshape(patches, [m.dims("x")[0], length, taps * channels]))
        filters = np.ascontiguousarray(w.transpose(2, 1, 0).reshape(taps * channels, out_channels))
        y = bb.emit(relax.op.matmul(patches, relax.const(filters)))               # [N, L_out, O]
        if m.has("bias"):
            bias = channel_bias(m["bias"], out_channels, 3).astype(w.dtype)
            y = bb.emit(relax.op.add(y, relax.const(bias)))
        return relax.op.permute_dims(y, [0, 2, 1])                                # [N, O, L_out]

    @staticmethod
    def _index(bb, out_dims, kernel, strides, dilation, padded) -> relax.Expr:
        """``[P, taps]``: the flat position, in the padded input, of each output position's taps."""
        if all(isinstance(d, (int, tvm.tirx.IntImm)) for d in out_dims):
            out = [int(d) for d in out_dims]
            grids = np.meshgrid(*[np.arange(o) * s for o, s in zip(out, strides)], indexing="ij")
            taps = np.meshgrid(*[np.arange(k) * d for k, d in zip(kernel, dilation)], indexing="ij")
            if len(out) == 1:
                pos, tap = grids[0].reshape(-1, 1), taps[0].reshape(1, -1)
            else:
                pos = (grids[0] * padded[1] + grids[1]).reshape(-1, 1)
                tap = (taps[0] * padded[1] + taps[1]).reshape(1, -1)
            return relax.const((pos + tap).astype("int32"), "int32")
        # a symbolic length (conv1d only, see check): arange(L_out) * stride + arange(k) * dilation
        (length,), (k,), (s,), (d,) = out_dims, kernel, strides, dilation
        pos = bb.emit(relax.op.arange(0, length, 1, "int64"))
        pos = bb.emit(relax.op.multiply(pos, relax.const(s, "int64")))
        pos = bb.emit(relax.op.expand_dims(pos, [1]))
        tap = relax.const((np.arange(k) * d).reshape(1, -1), "int64")
        return bb.emit(relax.op.add(pos, tap))
