"""Depthwise ``conv1d`` / ``conv2d`` (+ a per-channel bias) → a sum over the filter taps of shifted inputs.

A depthwise filter (one input and one output channel per group: ConvNeXt's 7×7, SegFormer's Mix-FFN 3×3, a
Conformer's 31-tap convolution module) has no matrix product in it for :mod:`.conv_matmul` to hand to the dense
template: per output element it is ``taps`` multiply-adds. TVM's stock depthwise kernel, scheduled by the generic
fallback, ran ConvNeXt's first 7×7 (96 channels at 56×56) in 6.3 ms. Written as ``Σ_t slice_t(x) · w[:, t]``, every
tap is an elementwise multiply-add of a strided slice of the padded input; FuseOps joins the whole sum into one
elementwise kernel, which reads each input row from cache ``taps`` times and vectorises along the width.

Pattern
    ``conv1d(x, w)`` or ``conv2d(x, w)`` with ``groups`` = input channels = output channels, optionally under the
    importer's per-channel bias ``add`` (the matcher is :mod:`.conv_matmul`'s).
Check (a reason says what keeps the stock kernel)
    layouts NCW/OIW or NCHW/OIHW, one input and one output channel per group, a float dtype with no other
    ``out_dtype``, a constant filter, static spatial dims (a conv1d's length may be symbolic), at most
    :data:`MAX_TAPS` taps.
Rewrite
    ``pad(x)``, then per tap ``strided_slice`` (the tap's offset, the conv's strides; for a symbolic length a
    ``take`` at ``arange`` positions) times the tap's filter column as a ``[C, 1(, 1)]`` constant, summed; ``+ b``.
    An input that is a channels-last tensor (or its tokens) transposed runs channels-last
    (:func:`channels_last_source`); any other transposed input is first copied, padded, by a kernel of its own
    (:func:`_materialised`): FuseOps would otherwise join the layout change into the taps' kernel, which then pays it
    once per tap (SegFormer's Mix-FFN: 9.1–10.7 ms against the stock kernel's 5.2).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from tvm import relax

from ..graph import op_name, same_dims, shape_dims
from ..rule import Match
from .conv_matmul import ConvRewrite, channel_bias, int_list
from .layout_chain import TRIALS, apply_layout_chain, at_size

#: taps of one filter, at most: each is a slice and a multiply-add in the graph (a 9×9 filter is 81)
MAX_TAPS = 81


#: ops a layout change may pass through on its way to the convolution (FuseOps joins them all into the taps' kernel)
_LAYOUT_OPS = ("relax.reshape", "relax.nn.pad", "relax.permute_dims", "relax.expand_dims", "relax.squeeze")


def _permuted_input(m: Match) -> Optional[str]:
    """'permute_dims' when x comes from a transpose (through reshapes and pads), else None."""
    e = m["x"]
    for _ in range(4):
        value = m.lookup(e)
        name = op_name(value)
        if name == "relax.permute_dims":
            return "permute_dims"
        if name not in _LAYOUT_OPS:
            return None
        e = value.args[0]
    return None


def channels_last_source(m: Match):
    """``(source, [N, *spatial, C])`` when x is a channels-last tensor moved to channels-first by the permutes (and
    reshapes) it comes from, else None. The source is ``[N, *spatial, C]`` (ConvNeXt's LayerNorm) or the same
    elements as tokens, ``[N, prod(spatial), C]`` (a matmul's rows: ConvNeXt's downsampling conv once it is a
    matmul, SegFormer's Mix-FFN). The batch may be symbolic: the chain is then decided at two trial batch sizes."""
    x = m.dims("x")
    if x is None or not all(isinstance(d, int) for d in x[1:]):
        return None
    cl_shape = [x[0], *x[2:], x[1]]
    token_shape = [x[0], int(np.prod(x[2:])), x[1]]
    to_cf = [0, len(x) - 1, *range(1, len(x) - 1)]
    chain, links, e = [], [], m["x"]
    for _ in range(4):
        value = m.lookup(e)
        if op_name(value) not in ("relax.reshape", "relax.permute_dims"):
            break
        chain.insert(0, value)
        links.insert(0, e)
        e = value.args[0]
        source_dims = shape_dims(e)
        if not (same_dims(source_dims, cl_shape) or same_dims(source_dims, token_shape)) or \
                not any(op_name(c) == "relax.permute_dims" for c in chain):
            continue
        if all(_moves_to_channels_first(chain, dims[0], dims[1], dims[2:], to_cf)
               for dims in (at_size([source_dims, cl_shape, *[shape_dims(v) for v in links]], trial)
                            for trial in TRIALS)):
            return e, cl_shape
    return None


def _moves_to_channels_first(chain, source_shape, cl_shape, link_shapes, to_cf) -> bool:
    if source_shape is None or cl_shape is None or any(s is None for s in link_shapes):
        return False
    source = np.arange(int(np.prod(source_shape)), dtype=np.int64).reshape(source_shape)
    try:
        want = source.reshape(cl_shape).transpose(to_cf)
        return np.array_equal(apply_layout_chain(chain, source, link_shapes), want)
    except ValueError:  # sizes that do not hold at these trial sizes (an export with a traced length baked in)
        return False


def _materialised(bb: relax.BlockBuilder, x: relax.Expr, pad_width, axes=None) -> relax.Expr:
    """``pad(x)`` (of ``x`` permuted by ``axes`` first, if given) as a kernel of its own (opaque to FuseOps), so
    that the taps' kernel reads a plain buffer.

    Fused into the taps, whatever layout change made ``x`` would be paid once per tap: a token-to-image reshape
    (index division by the width) measured 9.1 ms against the stock kernel's 5.2 on SegFormer's Mix-FFN, and a
    transpose read strided 10.7 ms. One copy, then contiguous taps."""
    from tvm import topi

    def copy(t):
        return topi.nn.pad(t if axes is None else topi.transpose(t, axes), pad_width[0::2], pad_width[1::2])

    return bb.emit_te(copy, x, primfunc_name_hint="depthwise_tap_source", primfunc_attrs={"op_pattern": _OPAQUE})


#: relax OpPatternKind.kOpaque: FuseOps never groups the kernel with another
_OPAQUE = 8


class DepthwiseConvAsTaps(ConvRewrite):
    name = "DepthwiseConvAsTaps"

    def check_conv(self, m: Match, op: str, a) -> Optional[str]:
        conv = m["conv"]
        w_shape, x = m.shape("w"), m.dims("x")
        groups = int(a.groups)
        if w_shape is None or x is None or groups == 1 or w_shape[1] != 1 or w_shape[0] != groups or \
                x[1] != groups:
            return f"{op} is not depthwise ({groups} groups, filter {w_shape}, input {x})"
        out = shape_dims(conv)
        symbolic = not all(isinstance(d, int) for d in x[2:]) or out is None or \
            not all(isinstance(d, int) for d in out[2:])
        if symbolic and (len(x) != 3 or out is None):  # a conv1d's length may be symbolic (an audio export)
            return f"{op} of a symbolic spatial size {x}"
        taps = int(np.prod(w_shape[2:]))
        if taps > MAX_TAPS:
            return f"{op}'s filter has {taps} taps (more than {MAX_TAPS})"
        if m.has("bias") and channel_bias(m["bias"], w_shape[0], len(x)) is None:
            return f"{op}'s bias of shape {m['bias'].shape} varies along other axes than the channels"
        return None

    def rewrite(self, m: Match, bb: relax.BlockBuilder) -> relax.Expr:
        conv = m["conv"]
        a = conv.attrs
        w = m.const("w")
        channels, _, *kernel = w.shape
        rank = len(m.dims("x"))
        spatial = rank - 2
        strides, dilation, padding = int_list(a.strides), int_list(a.dilation), int_list(a.padding)
        out = shape_dims(conv)[2:]
        permuted = _permuted_input(m) is not None
        last = channels_last_source(m) if permuted else None
        # a layout change other than one permute of the channels-last tensor itself is copied out first; so is a
        # conv1d's channels-first input, transposed on the way: along its length the taps' kernel would vectorise
        # a loop fused over (channel, position), one index division per element (a Conformer's 31 taps over 768
        # channels, 200 frames: 2.5-3.1 ms, as slow as the stock kernel); along the channels it reads rows
        copy_first = permuted and (last is None or not same_dims(shape_dims(last[0]), last[1]))
        to_rows = last is None and spatial == 1
        if last is not None:  # taps over the channels-last tensor: channels innermost, read contiguously
            x = m.remap(last[0])
            if not same_dims(shape_dims(last[0]), last[1]):
                x = bb.emit(relax.op.reshape(x, last[1]))
        else:
            x = m.arg("x")
        if last is not None or to_rows:
            axes, column_shape = list(range(1, rank - 1)), (channels,)
        else:
            axes, column_shape = list(range(2, rank)), (channels,) + (1,) * spatial
        pad_width = [0, 0] * rank
        for i, axis in enumerate(axes):
            pad_width[2 * axis: 2 * axis + 2] = [padding[i], padding[spatial + i]]
        if to_rows:
            x = _materialised(bb, x, pad_width, axes=[0, 2, 1])
        elif copy_first:
            x = _materialised(bb, x, pad_width)
        elif any(padding):
            x = bb.emit(relax.op.nn.pad(x, pad_width))
        total = None
        symbolic = not all(isinstance(o, int) for o in out)
        for tap in np.ndindex(*kernel):
            begin = [t * d for t, d in zip(tap, dilation)]
            end = [b + s * (o - 1) + 1 for b, s, o in zip(begin, strides, out)]
            shifted = bb.emit(relax.op.strided_slice(x, axes, begin, end, strides, assume_inbound=True))
            column = w[(slice(None), 0, *tap)].reshape(column_shape)
            term = bb.emit(relax.op.multiply(shifted, relax.const(np.ascontiguousarray(column))))
            total = term if total is None else bb.emit(relax.op.add(total, term))
        if m.has("bias"):
            bias = channel_bias(m["bias"], channels, rank).astype(w.dtype)
            total = bb.emit(relax.op.add(total, relax.const(bias.reshape(column_shape))))
        if last is not None or to_rows:  # back to the conv's channels-first output (a following permute cancels it)
            return relax.op.permute_dims(total, [0, rank - 1, *range(1, rank - 1)])
        return total
