"""SmoothGrad (Smilkov, Thorat, Kim, Viégas & Wattenberg 2017) at the input embeddings:
the mean of an attribution over noisy copies of the inputs (`NoisyCopies`, run by the
engine's copies pass), with captum's `NoiseTunnel` semantics, and the method's fold.
docs/methods.md ("SmoothGrad") gives the formula and where the noise goes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from explain.errors import OptionError
from explain.layout import TokenLayout
from explain.rules.lrp_based import InputRelevance
from explain.rules.registry import (
    CopiesSeen,
    EmbeddingBaseline,
    Need,
    RuleContext,
    register_method,
)

__all__ = ["NoisyCopies", "check_noise", "smoothgrad"]


def check_noise(samples: int, sigma: float) -> None:
    """OptionError for a number of copies below 1 or a noise level that is negative or
    not finite."""
    if samples < 1:
        raise OptionError(f"samples must be >= 1; got {samples}")
    if not 0 <= sigma < float("inf"):
        raise OptionError(f"sigma must be a finite number >= 0; got {sigma}")


class NoisyCopies:
    """`samples` copies of the inputs with Gaussian noise added to their embeddings (a
    `CopiesMethod`), each copy's attribution per embedding entry averaged: the gradient's
    absolute value (captum's `Saliency`) or, with `times_input`, the noisy embeddings
    times their gradient (`InputXGradient`); squared before the mean with `squared`
    (captum's "smoothgrad_sq"). Summed over the hidden size at the end.

    The noise of sample b has the standard deviation `sigma` * (max - min) of its
    embeddings' entries at its real tokens (pads and tokens no column sees stay as they
    are). It is drawn from a generator of its own seeded with `seed`, copy after copy,
    as `torch.randn` of as many values as those entries, in their (row-major) order, so
    a sample gets the same noise alone as in any batch, and the caller's RNG is
    untouched."""

    backward = True
    linear_in_score = False  # the absolute value, the square
    baseline_score = False

    def __init__(
        self,
        layout: TokenLayout,
        batch: int,
        *,
        samples: int,
        sigma: float,
        seed: int,
        squared: bool,
        times_input: bool,
    ) -> None:
        self.baseline = EmbeddingBaseline("zero")  # the copies blend nothing: weight 1
        self.count = samples
        self._batch, self._sigma, self._seed = batch, sigma, seed
        self._squared, self._times_input = squared, times_input
        mask = layout.token_mask  # (B, N), or (C, B, N) where each column sees its own
        self._tokens = None if mask is None else mask.reshape(-1, *mask.shape[-2:]).any(dim=0)
        self._real: Tensor | None = None
        self._generators: list[torch.Generator] = []
        self._stdevs: list[float] = []
        self._noisy: Tensor | None = None
        self._total: Tensor | None = None

    def weights(self, copies: range) -> Tensor:
        return torch.ones(len(copies), 1, 1)

    def shift(self, copies: range, inputs: Tensor) -> Tensor:
        """Each copy's noise (c, B, ...) as the class says; kept with the noisy
        embeddings for `add`."""
        if self._real is None:  # the first chunk: each sample's entries and range
            self._real = self._real_entries(inputs)
            real = self._real.to(inputs.device)
            real = real.reshape(*real.shape, *(1,) * (inputs.dim() - real.dim())).expand_as(inputs)
            self._generators = [torch.Generator().manual_seed(self._seed) for _ in real]
            largest = torch.finfo(inputs.dtype).max
            high = inputs.masked_fill(~real, -largest).flatten(1).amax(dim=1)
            low = inputs.masked_fill(~real, largest).flatten(1).amin(dim=1)
            self._stdevs = (self._sigma * (high - low)).tolist()  # one wait for the batch
        real = self._real
        dtype = torch.float64 if inputs.dtype == torch.float64 else torch.float32
        noise = torch.zeros(len(copies), *inputs.shape, dtype=dtype)
        for copy in noise:  # copy after copy: the draws do not depend on the chunks
            for sample, at, generator, stdev in zip(
                copy, real, self._generators, self._stdevs, strict=True
            ):
                draw = torch.randn(sample[at].shape, generator=generator, dtype=dtype)
                sample[at] = draw * stdev
        noise = noise.to(inputs.device, inputs.dtype)
        self._noisy = inputs + noise
        return noise

    def _real_entries(self, inputs: Tensor) -> Tensor:
        """Bool on the host, True at each sample's real entries: (B, N) at the real
        tokens where the embeddings are laid out (B, N, D) over the layout's tokens, else
        True everywhere, shaped as the inputs."""
        real = self._tokens
        if real is None or inputs.dim() != 3 or tuple(inputs.shape[:2]) != tuple(real.shape):
            return torch.ones(inputs.shape, dtype=torch.bool)
        return real.cpu()

    def start(self, scores: Tensor, at_baseline: Tensor | None) -> None:
        self._columns = scores.shape[1]

    def add(self, copies: range, columns: slice, scores: Tensor, gradients: Tensor | None) -> None:
        assert gradients is not None and self._noisy is not None
        dtype = gradients.dtype if gradients.dtype == torch.float64 else torch.float32
        gradient = gradients.unflatten(1, (len(copies), self._batch)).to(dtype)
        if self._times_input:
            attribution = gradient * self._noisy.to(dtype)
        else:
            attribution = gradient.abs()
        if self._squared:
            attribution = attribution.square()
        part = attribution.sum(dim=1)  # (C', B, ...): the chunk's copies summed
        if self._total is None:
            self._total = part.new_zeros((self._columns, *part.shape[1:]))
        self._total[columns] += part

    def finish(self, seen: CopiesSeen) -> tuple[Tensor, dict[str, Any]]:
        assert self._total is not None
        noise = {"samples": self.count, "sigma": self._sigma, "seed": self._seed}
        return seen.tokens(self._total / self.count), {**noise, "noise_stdev": self._stdevs}


@register_method(
    "smoothgrad", needs={Need.EMBEDDING_COPIES}, class_specific=True, copies=NoisyCopies
)
def smoothgrad(
    context: RuleContext,
    samples: int = 50,
    sigma: float = 0.15,
    seed: int = 0,
    squared: bool = False,
    times_input: bool = False,
) -> InputRelevance:
    """SmoothGrad (Smilkov et al. 2017): gradients averaged over noisy input embeddings."""
    check_noise(samples, sigma)  # refused before any forward
    return InputRelevance(context)
