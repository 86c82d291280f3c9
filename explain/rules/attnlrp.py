"""AttnLRP (Achtibat et al., ICML 2024) and CP-LRP (Ali et al., ICML 2022).

Both are LRP rule sets computed as Gradient x Input in one forward and one backward pass,
with the backward of normalisations, element-wise non-linearities and products modified
for the call (explain.lrp.attnlrp). The relevance of a token is the sum over the hidden
size of its embedding times the embedding's modified gradient, read at the word- or
patch-embedding output; the sink only holds what that pass delivers.
"""

from __future__ import annotations

from torch import Tensor

from explain.rules.fold import compute_dtype
from explain.rules.registry import Need, RuleContext, register_method

__all__ = ["EmbeddingRelevance", "attnlrp", "cp_lrp"]


class EmbeddingRelevance:
    """Sink of the Gradient x Input methods: no block records, the token relevance (B, N)
    of the embeddings as a whole."""

    layers = range(0)

    def __init__(self, context: RuleContext) -> None:
        self._relevance: Tensor | None = None

    def add(self, layer: int, attention: Tensor, gradient: Tensor | None) -> None:
        """These methods use no block records."""

    def add_input(self, relevance: Tensor) -> None:
        self._relevance = relevance.to(compute_dtype(relevance))

    def result(self) -> Tensor:
        if self._relevance is None:
            raise RuntimeError("the embedding relevance never arrived")
        return self._relevance


@register_method(
    "attnlrp",
    needs={Need.EMBEDDING_GRADIENTS},
    class_specific=True,
    gradient_rules="attnlrp",
)
def attnlrp(context: RuleContext) -> EmbeddingRelevance:
    """AttnLRP (Achtibat et al. 2024): Gradient x Input with LRP rules through attention."""
    return EmbeddingRelevance(context)


@register_method(
    "cp_lrp",
    needs={Need.EMBEDDING_GRADIENTS},
    class_specific=True,
    gradient_rules="cp_lrp",
)
def cp_lrp(context: RuleContext) -> EmbeddingRelevance:
    """CP-LRP (Ali et al. 2022): Gradient x Input, attention weights and gates held fixed."""
    return EmbeddingRelevance(context)
