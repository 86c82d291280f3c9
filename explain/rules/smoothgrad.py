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

__all__ = ["NoisyCopies", "check_noise", "counter_normals", "smoothgrad"]


_WORD = 0xFFFFFFFF
_FIRST, _SECOND = 0x7FEB352D, 0x846CA68B - (1 << 32)
"""lowbias32's multipliers (C. Wellons, "Hash Prospector"), the second as the number of
magnitude below 2^31 congruent to it mod 2^32: a 32-bit word times either fits an int64."""


def _mix32(word: Any) -> Any:
    """lowbias32, a bijection of 32-bit words, of a Python int or an int64 tensor of
    words in [0, 2^32): the same arithmetic for both (every product is below 2^63 in
    magnitude, and `& _WORD` takes it mod 2^32 as two's complement does)."""
    word = ((word ^ (word >> 16)) * _FIRST) & _WORD
    word = ((word ^ (word >> 15)) * _SECOND) & _WORD
    return word ^ (word >> 16)


def counter_normals(seed: int, copies: range, entries: Tensor, dtype: torch.dtype) -> Tensor:
    """Standard normal draws in `dtype`, (c, B', E) for the c copies of `copies` and the
    entry numbers `entries` (B', E) (or (E,), one sample's, giving (c, 1, E)), int64 in
    [0, 2^32), each a function of (seed, copy, entry) alone: a counter-based generator.
    With mix lowbias32, the seed (mod 2^64) and copy s give the key
    k_s = mix(s ^ mix(mix(seed_lo) ^ seed_hi)), entry j the word w = mix(mix(j) ^ k_s),
    its top 24 bits the uniform u = (floor(w / 2^8) + 1/2) / 2^24 (exact in float32, in
    (0, 1)), and the draw is the standard normal quantile of u (so |draw| <= 5.3)."""
    seed %= 1 << 64
    seeded = _mix32(_mix32(seed & _WORD) ^ (seed >> 32))
    keys = torch.tensor([[[_mix32(copy ^ seeded)]] for copy in copies], device=entries.device)
    words = _mix32(_mix32(entries) ^ keys)
    return torch.special.ndtri(((words >> 8).to(dtype) + 0.5) * 2.0**-24)


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
    are). At copy s and real entry j (j numbers the sample's real entries in row-major
    order, from 1) it is `counter_normals` of (`seed`, s, j), a function of those three
    alone: a sample gets the same noise alone as in any batch and under any chunking,
    every sample and copy of a chunk is drawn in a few batched tensor ops, and the
    caller's RNG is untouched."""

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
        self._entries: Tensor | None = None
        self._scale: Tensor | None = None
        self._stdevs: list[float] = []
        self._noisy: Tensor | None = None
        self._total: Tensor | None = None

    def weights(self, copies: range) -> Tensor:
        return torch.ones(len(copies), 1, 1)

    def shift(self, copies: range, inputs: Tensor) -> Tensor:
        """Each copy's noise (c, B, ...) as the class says; kept with the noisy
        embeddings for `add`."""
        dtype = torch.float64 if inputs.dtype == torch.float64 else torch.float32
        if self._entries is None or self._scale is None:  # the first chunk
            self._entries, self._scale = self._entries_and_scale(inputs, dtype)
        draws = counter_normals(self._seed, copies, self._entries, dtype)
        noise = (draws * self._scale).to(inputs.dtype).reshape(len(copies), *inputs.shape)
        self._noisy = inputs + noise
        return noise

    def _entries_and_scale(self, inputs: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Each entry's number among its sample's real ones, from 1 ((E,) where every
        entry of the (B, E) flattened inputs is real, else (B, E)), and each entry's noise
        scale (B, E or 1) in `dtype`: its sample's stdev at the real entries, 0 elsewhere.
        The real entries are those at the real tokens where the embeddings are laid out
        (B, N, D) over the layout's tokens, else all."""
        entries, tokens = inputs.flatten(1), self._tokens
        if tokens is None or inputs.dim() != 3 or tuple(inputs.shape[:2]) != tuple(tokens.shape):
            real, high, low = None, entries, entries
        else:
            real = tokens.to(inputs.device)[..., None].expand_as(inputs).flatten(1)
            pad, largest = ~real, torch.finfo(inputs.dtype).max
            high, low = entries.masked_fill(pad, -largest), entries.masked_fill(pad, largest)
        stdev = self._sigma * (high.amax(dim=1, keepdim=True) - low.amin(dim=1, keepdim=True))
        self._stdevs = [value for (value,) in stdev.tolist()]  # one wait for the batch
        if real is None:
            return torch.arange(1, entries.shape[1] + 1, device=inputs.device), stdev.to(dtype)
        return real.cumsum(dim=1), (stdev * real).to(dtype)

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
