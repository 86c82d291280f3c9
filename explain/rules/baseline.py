"""The random baseline: the chance level that every evaluation must beat."""

from __future__ import annotations

import torch
from torch import Tensor

from explain.rules.registry import RuleContext, SpreadMode, register_method

__all__ = ["RandomRelevance", "random"]


class RandomRelevance:
    """Uniform noise from its own seeded generator (the global RNG is never touched), the
    same for every column of the readout rows (R, B, N)."""

    layers = range(0)
    spread: SpreadMode | None = None

    def __init__(self, readout: Tensor, num_tokens: int, seed: int):
        self._columns = readout.shape[0]
        self._shape = (1, readout.shape[1], num_tokens)
        self._device = readout.device
        self._dtype = readout.dtype if readout.dtype == torch.float64 else torch.float32
        self._seed = seed

    def add(self, layer: int, columns: slice, attention: Tensor, gradients: Tensor | None) -> None:
        """Blocks carry no information for this baseline."""

    def result(self) -> Tensor:
        generator = torch.Generator().manual_seed(self._seed)
        noise = torch.rand(self._shape, generator=generator, dtype=self._dtype).to(self._device)
        return noise if self._columns == 1 else noise.expand(self._columns, *self._shape[1:])


@register_method("random", needs=(), class_specific=False)
def random(context: RuleContext, seed: int = 0) -> RandomRelevance:
    """Uniform random relevance, reproducible for a seed and a batch (a chance baseline)."""
    # Over the layout's tokens: a windowed model reads out fewer tokens than its input has.
    return RandomRelevance(context.readout, context.layout.num_tokens, seed)
