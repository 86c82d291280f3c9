"""Relevance rules: pure functions over recorded blocks, registered by name."""

from explain.rules import attention, attnlrp, baseline, gradient, lrp  # noqa: F401  (registers)
from explain.rules.registry import METHODS, Method, RuleContext, Sink, get_method, register_method

__all__ = ["METHODS", "Method", "RuleContext", "Sink", "get_method", "register_method"]
