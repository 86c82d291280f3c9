"""Integrated gradients (Sundararajan, Taly & Yan, ICML 2017) at the input embeddings:
the quadratures of its path integral (`integration_points`), the path's points as copies
of the inputs and their weighted sum (`PathIntegral`, run by the engine's copies pass)
and the method's fold. docs/methods.md ("The baselines") gives the formula, the
quadratures and the completeness each call records.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import Tensor

from explain.errors import OptionError
from explain.layout import TokenLayout
from explain.rules.lrp_based import InputRelevance
from explain.rules.registry import (
    CopiesSeen,
    Need,
    RuleContext,
    embedding_baseline,
    register_method,
)

__all__ = [
    "GAUSS_LEGENDRE_MAX_STEPS",
    "QUADRATURES",
    "PathIntegral",
    "Quadrature",
    "integrated_gradients",
    "integration_points",
]

Quadrature = Literal[
    "gausslegendre", "riemann_right", "riemann_left", "riemann_middle", "riemann_trapezoid"
]
QUADRATURES: tuple[str, ...] = get_args(Quadrature)
GAUSS_LEGENDRE_MAX_STEPS = 1024
"""The most Gauss-Legendre nodes: numpy computes them from an S x S matrix's eigenvalues
(S^2 memory, S^3 time), and 1,024 nodes already integrate polynomials of degree 2,047
exactly; the Riemann rules take any number of steps."""


def integration_points(steps: int, quadrature: str) -> tuple[Tensor, Tensor]:
    """(S,) float64 nodes a_s in [0, 1] and weights w_s of `quadrature` with S = `steps`
    points, for the integral of a function over [0, 1]:

    - "gausslegendre": the Gauss-Legendre rule on [0, 1] (numpy's nodes x and weights v
      on [-1, 1] mapped as a = (1 + x) / 2, w = v / 2); exact for polynomials of degree
      up to 2S - 1;
    - "riemann_right", "riemann_left", "riemann_middle": a = s / S for s = 1 .. S,
      (s - 1) / S, or (s - 1/2) / S, each with w = 1 / S ("riemann_right" is the sum of
      the paper's equation 3);
    - "riemann_trapezoid": a = s / (S - 1) for s = 0 .. S - 1, w = 1 / (S - 1), halved at
      both ends (S >= 2).

    OptionError for steps the rule cannot take (below its least, or Gauss-Legendre
    past GAUSS_LEGENDRE_MAX_STEPS)."""
    if quadrature not in QUADRATURES:
        raise OptionError(f"quadrature must be one of {', '.join(QUADRATURES)}; got {quadrature!r}")
    least = 2 if quadrature == "riemann_trapezoid" else 1
    if steps < least:
        raise OptionError(f"{quadrature} takes steps >= {least}; got {steps}")
    if quadrature == "gausslegendre" and steps > GAUSS_LEGENDRE_MAX_STEPS:
        raise OptionError(
            f"gausslegendre takes at most {GAUSS_LEGENDRE_MAX_STEPS} steps; got {steps} "
            "(for more, choose a Riemann quadrature)"
        )
    if quadrature == "gausslegendre":
        nodes, weights = np.polynomial.legendre.leggauss(steps)
        return torch.from_numpy((1 + nodes) / 2), torch.from_numpy(weights / 2)
    if quadrature == "riemann_trapezoid":
        alphas = torch.arange(steps, dtype=torch.float64) / (steps - 1)
        weights = torch.full((steps,), 1 / (steps - 1), dtype=torch.float64)
        weights[[0, -1]] /= 2
        return alphas, weights
    shift = {"riemann_right": 1.0, "riemann_left": 0.0, "riemann_middle": 0.5}[quadrature]
    alphas = (torch.arange(steps, dtype=torch.float64) + shift) / steps
    return alphas, torch.full((steps,), 1 / steps, dtype=torch.float64)


class PathIntegral:
    """The path's points as copies of the inputs (a `CopiesMethod`): the inputs and the
    baseline first, then point a_s as the copy e0 + a_s (e - e0), its every column's
    gradient weighted by w_s and summed; times e - e0, over the hidden size. The settings
    record the path and its completeness: `baseline_score` y(e0) and
    `convergence_delta`, the relevance's sum minus y(e) - y(e0) (captum's name), per
    input and column."""

    backward = True
    linear_in_score = True
    baseline_score = True

    def __init__(
        self,
        layout: TokenLayout,
        batch: int,
        *,
        steps: int,
        quadrature: str,
        baseline_token: int | None,
    ) -> None:
        self._alphas, self._weights = integration_points(steps, quadrature)
        self.baseline = embedding_baseline(baseline_token, layout.modality)
        self.count = steps
        self._batch = batch
        self._path: dict[str, Any] = {"steps": steps, "quadrature": quadrature}
        self._total: Tensor | None = None

    def weights(self, copies: range) -> Tensor:
        return self._alphas[copies.start : copies.stop, None, None]

    def shift(self, copies: range, inputs: Tensor) -> None:
        return None

    def start(self, scores: Tensor, at_baseline: Tensor | None) -> None:
        assert at_baseline is not None
        self._scores, self._at_baseline = scores, at_baseline

    def add(self, copies: range, columns: slice, scores: Tensor, gradients: Tensor | None) -> None:
        assert gradients is not None
        dtype = gradients.dtype if gradients.dtype == torch.float64 else torch.float32
        # (C', copies * B, ...) -> the chunk's weighted sum, per column
        path = gradients.unflatten(1, (len(copies), self._batch)).to(dtype)
        step = self._weights[copies.start : copies.stop].to(path.device, dtype)
        part = (path * step.reshape(1, -1, *[1] * (path.dim() - 2))).sum(dim=1)
        if self._total is None:
            count = self._scores.shape[1]
            self._total = part.new_zeros((count, *part.shape[1:]))
        self._total[columns] += part

    def finish(self, seen: CopiesSeen) -> tuple[Tensor, dict[str, Any]]:
        assert self._total is not None
        relevance = seen.tokens(seen.difference * self._total)
        gap = relevance.sum(dim=-1).T - (self._scores - self._at_baseline).to(relevance.dtype)
        return relevance, {
            **self._path,
            "baseline": self.baseline.describe(),
            "baseline_score": self._at_baseline,
            "convergence_delta": gap,
        }


@register_method(
    "integrated_gradients",
    needs={Need.EMBEDDING_COPIES},
    class_specific=True,
    copies=PathIntegral,
)
def integrated_gradients(
    context: RuleContext,
    steps: int = 50,
    quadrature: Quadrature = "gausslegendre",
    baseline_token: int | None = None,
) -> InputRelevance:
    """Integrated gradients (Sundararajan et al. 2017) at the word or patch embeddings."""
    integration_points(steps, quadrature)  # refused before any forward
    embedding_baseline(baseline_token, context.layout.modality)
    return InputRelevance(context)
