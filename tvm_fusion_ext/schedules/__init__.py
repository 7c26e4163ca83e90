"""Schedule templates with tunable knobs for the fused operators: ``cpu/`` (llvm) and ``cuda/``."""

from .registry import get_template, register_template, registered, target_family

__all__ = ["get_template", "register_template", "registered", "target_family"]
