"""Schedule templates with tunable knobs for the fused operators, as dlight-style rules: ``cpu/`` (llvm) and
``cuda/``; :mod:`.registry` says which rules serve a target and in which order; :mod:`.kernel_knobs` is the
kernel signature by which a tuned kernel's knobs reach kernels of other (run-time) row counts."""

from .registry import fallback_rules, get_template, registered, template_rules
from .rule import Knobs, TemplateRule

__all__ = ["Knobs", "TemplateRule", "fallback_rules", "get_template", "registered", "template_rules"]
