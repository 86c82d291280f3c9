"""Relevance rules: pure functions over recorded blocks, registered by name."""

from explain.rules import attention, attnlrp, baseline, gradient, lrp  # noqa: F401  (registers)
from explain.rules.registry import (
    LRP_NEEDS,
    METHODS,
    Method,
    Need,
    RuleContext,
    Sink,
    get_method,
    register_method,
)

__all__ = [
    "LRP_NEEDS",
    "METHODS",
    "Method",
    "Need",
    "RuleContext",
    "Sink",
    "get_method",
    "register_method",
]
