"""Gradient x Input at the input embeddings: plain, and under the LRP rules of AttnLRP
(Achtibat et al., ICML 2024) and CP-LRP (Ali et al., ICML 2022), whose modified backward
explain.lrp.attnlrp hooks for the call. One forward and one backward to the word- or
patch-embedding output; the fold (full LRP's) only holds what that pass delivers.
"""

from __future__ import annotations

from explain.rules.lrp_based import InputRelevance
from explain.rules.registry import Need, RuleContext, register_method

__all__ = ["attnlrp", "cp_lrp", "gradient_x_input"]


@register_method("gradient_x_input", needs={Need.EMBEDDING_GRADIENTS}, class_specific=True)
def gradient_x_input(context: RuleContext) -> InputRelevance:
    """Gradient x Input (Shrikumar et al. 2016) at the word or patch embeddings."""
    return InputRelevance(context)


@register_method(
    "attnlrp",
    needs={Need.EMBEDDING_GRADIENTS},
    class_specific=True,
    gradient_rules="attnlrp",
)
def attnlrp(context: RuleContext) -> InputRelevance:
    """AttnLRP (Achtibat et al. 2024): Gradient x Input with LRP rules through attention."""
    return InputRelevance(context)


@register_method(
    "cp_lrp",
    needs={Need.EMBEDDING_GRADIENTS},
    class_specific=True,
    gradient_rules="cp_lrp",
)
def cp_lrp(context: RuleContext) -> InputRelevance:
    """CP-LRP (Ali et al. 2022): Gradient x Input, attention weights and gates held fixed."""
    return InputRelevance(context)
