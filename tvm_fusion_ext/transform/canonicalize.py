"""Canonicalise exporter idioms, so fusion rules see one spelling of each meaning.

Each idiom is one rule in ``canonical/``; they run in this order, each as its own rewrite sweep, because
later ones look for what earlier ones produce (a merged attention scale is found once the NaN guard after
the softmax is gone, a boolean mask once it is additive).
"""

from __future__ import annotations

import tvm

from .canonical.attention_scale import MergeSplitAttentionScale
from .canonical.bool_mask import BoolMaskToAdditive
from .canonical.conv_matmul import ConvAsMatmul
from .canonical.depthwise_conv_taps import DepthwiseConvAsTaps
from .canonical.einsum_matmul import EinsumAsMatmul
from .canonical.gather_nd_slice import GatherNDToSlice
from .canonical.gelu_erf import ErfGeluToGelu
from .canonical.identity_cast import DropIdentityCast
from .canonical.layout_chain import LayoutChainAsReshape
from .canonical.gelu_tanh import TanhGeluToGeluTanh
from .canonical.layernorm_decomposed import DecomposedLayerNormToLayerNorm
from .canonical.lowest_clamp import DropLowestClamp
from .canonical.multiplicative_mask import MultiplicativeMaskToAdditive
from .canonical.round_trip_cast import DropRoundTripCast
from .canonical.scalar_constants import FoldScalarConstants
from .canonical.silu import SigmoidMulToSilu
from .canonical.single_concat import DropSingleConcat
from .canonical.softmax_nan_guard import DropSoftmaxNanGuard
from .rule import apply_rules

CANONICAL_RULES = (
    FoldScalarConstants,
    DropIdentityCast,
    DropRoundTripCast,
    DropSingleConcat,
    EinsumAsMatmul,
    ConvAsMatmul,
    DepthwiseConvAsTaps,
    GatherNDToSlice,
    ErfGeluToGelu,
    TanhGeluToGeluTanh,
    SigmoidMulToSilu,
    DecomposedLayerNormToLayerNorm,
    DropSoftmaxNanGuard,
    DropLowestClamp,
    MultiplicativeMaskToAdditive,
    BoolMaskToAdditive,
    MergeSplitAttentionScale,
    LayoutChainAsReshape,
)


def Canonicalize() -> tvm.transform.Pass:  # noqa: N802  (TVM pass naming)
    rules = [cls() for cls in CANONICAL_RULES]

    def _transform(mod, _ctx):
        for rule in rules:
            mod = apply_rules(mod, [rule])
        return mod

    return tvm.transform.module_pass(_transform, opt_level=0, name="tfx.Canonicalize")
