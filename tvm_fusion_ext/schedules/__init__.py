"""Schedule templates with tunable knobs for the fused operators, as dlight-style rules: ``cpu/`` (llvm) and
``cuda/``; :mod:`.registry` says which rules serve a target and in which order."""

from .registry import fallback_rules, get_template, registered, template_rules
from .rule import Knobs, TemplateRule

__all__ = ["Knobs", "TemplateRule", "fallback_rules", "get_template", "registered", "template_rules"]
