"""The random baseline: the chance level that every evaluation must beat."""

from __future__ import annotations

import torch
from torch import Tensor

from explain.rules.registry import RuleContext, register_method

__all__ = ["RandomRelevance", "random"]


class RandomRelevance:
    """Uniform noise from its own seeded generator: the global RNG is never touched."""

    layers = range(0)

    def __init__(self, readout: Tensor, num_tokens: int, seed: int):
        self._shape = (readout.shape[0], num_tokens)
        self._device = readout.device
        self._dtype = readout.dtype if readout.dtype == torch.float64 else torch.float32
        self._seed = seed

    def add(self, layer: int, attention: Tensor, gradient: Tensor | None) -> None:
        """Blocks carry no information for this baseline."""

    def result(self) -> Tensor:
        generator = torch.Generator().manual_seed(self._seed)
        noise = torch.rand(self._shape, generator=generator, dtype=self._dtype)
        return noise.to(self._device)


@register_method("random", needs=(), class_specific=False)
def random(context: RuleContext, seed: int = 0) -> RandomRelevance:
    """Uniform random relevance, reproducible for a seed and a batch (a chance baseline)."""
    # Over the layout's tokens: a windowed model reads out fewer tokens than its input has.
    return RandomRelevance(context.readout, context.layout.num_tokens, seed)
