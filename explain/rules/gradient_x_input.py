"""AttnLRP (Achtibat et al., ICML 2024) and CP-LRP (Ali et al., ICML 2022).

Both are LRP rule sets computed as Gradient x Input in one forward and one backward pass,
with the backward of normalisations, element-wise non-linearities and products modified
for the call (explain.lrp.attnlrp). The relevance of a token is the sum over the hidden
size of its embedding times the embedding's modified gradient, read at the word- or
patch-embedding output; the sink (the one of full LRP) only holds what that pass delivers.
"""

from __future__ import annotations

from explain.rules.lrp_based import InputRelevance
from explain.rules.registry import Need, RuleContext, register_method

__all__ = ["attnlrp", "cp_lrp"]


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
