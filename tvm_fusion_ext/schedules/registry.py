"""Which schedule rules serve a target, in the order they are tried: our templates, then a generic fallback.

The list is explicit (no registration by import side effect) so that a reader sees every template in one place.
Templates import lazily: importing the package must not import schedule code, nor TVM's tensor intrinsics.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import tvm

from ..targets import TargetInfo
from .rule import TemplateRule


def _all_templates() -> List[TemplateRule]:
    from .cpu.attention import AttentionCPU
    from .cpu.decode_attention import DecodeAttentionCPU
    from .cpu.dense import DenseCPU
    from .cpu.gated_dense import GatedDenseCPU
    from .cpu.layernorm import LayerNormCPU
    from .cpu.quantize_rows import QuantizeRowsCPU
    from .cpu.rmsnorm import RMSNormCPU
    from .cuda.attention import AttentionCUDA
    from .cuda.decode_attention import DecodeAttentionCUDA
    from .cuda.dense import DenseCUDA
    from .cuda.gated_dense import GatedDenseCUDA
    from .cuda.layernorm import LayerNormCUDA
    from .cuda.rmsnorm import RMSNormCUDA

    return [DenseCPU(), GatedDenseCPU(), AttentionCPU(), DecodeAttentionCPU(), LayerNormCPU(), RMSNormCPU(),
            QuantizeRowsCPU(),
            DenseCUDA(), GatedDenseCUDA(), AttentionCUDA(), DecodeAttentionCUDA(), LayerNormCUDA(), RMSNormCUDA()]


def registered() -> Dict[Tuple[str, str], TemplateRule]:
    """Every template by ``(block rule, family)``."""
    return {(t.block_rule, t.family): t for t in _all_templates()}


def template_rules(target: tvm.target.Target, knobs: Optional[dict] = None, kernel_knobs=None) -> List[TemplateRule]:
    """The templates for ``target``'s family; ``knobs`` maps a block rule ("tfx.dense") to its knobs;
    ``kernel_knobs`` (a :class:`~.kernel_knobs.KernelKnobs`) gives knobs per kernel signature over those."""
    family = TargetInfo.of(target).family
    knobs = knobs or {}
    return [t.with_knobs(knobs.get(t.block_rule), kernel_knobs) for t in _all_templates() if t.family == family]


def get_template(block_rule: str, target: tvm.target.Target) -> Optional[TemplateRule]:
    """The template scheduling blocks annotated ``block_rule`` on ``target``, or None."""
    family = TargetInfo.of(target).family
    return next((t for t in _all_templates() if t.block_rule == block_rule and t.family == family), None)


def fallback_rules(target: tvm.target.Target) -> list:
    """What schedules every kernel no template and no tuning record covers (dlight rules; they never raise)."""
    from tvm.s_tir import dlight as dl

    if TargetInfo.of(target).is_cpu:
        from .cpu.fallback import Fallback

        return [Fallback()]
    return [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]


def prepare_for_records(target: tvm.target.Target) -> None:
    """Make what tuning records of ``target`` refer to known to TVM before they are replayed (our tensor-core
    intrinsics are registered on first use, and a CUDA record may name them; a CPU int8 record, a dot-product
    intrinsic). Reading a record directory parses its traces, so this comes before opening one."""
    if TargetInfo.of(target).is_cuda:
        from .cuda.tensorcore import register_intrinsics

        register_intrinsics()
    elif TargetInfo.of(target).is_cpu:
        from .cpu.dot_intrin import register_all

        register_all()  # every CPU's: a directory may pool records of several CPUs
