"""Relevance rules: pure functions over recorded blocks, registered by name."""

from explain.rules import (  # noqa: F401  (registers the methods)
    attention,
    baseline,
    gradient,
    gradient_x_input,
    integrated_gradients,
    lrp_based,
    occlusion,
    smoothgrad,
)
from explain.rules.registry import (
    LRP_NEEDS,
    METHODS,
    Fold,
    Method,
    Need,
    RuleContext,
    get_method,
    register_method,
)

__all__ = [
    "LRP_NEEDS",
    "METHODS",
    "Fold",
    "Method",
    "Need",
    "RuleContext",
    "get_method",
    "register_method",
]
