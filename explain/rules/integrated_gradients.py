"""Integrated gradients (Sundararajan, Taly & Yan, ICML 2017) at the input embeddings:
the quadratures of its path integral (`integration_points`) and the method's fold. The
engine runs the path's points as copies of the inputs (explain.engine.passes
`IntegratedGradientPass`); docs/methods.md ("The baselines") gives the formula, the
quadratures and the completeness each call records.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np
import torch
from torch import Tensor

from explain.errors import OptionError
from explain.rules.embedding_baseline import embedding_baseline
from explain.rules.lrp_based import InputRelevance
from explain.rules.registry import Need, RuleContext, register_method

__all__ = ["QUADRATURES", "Quadrature", "integrated_gradients", "integration_points"]

Quadrature = Literal[
    "gausslegendre", "riemann_right", "riemann_left", "riemann_middle", "riemann_trapezoid"
]
QUADRATURES: tuple[str, ...] = get_args(Quadrature)


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

    OptionError for steps the rule cannot take."""
    if quadrature not in QUADRATURES:
        raise OptionError(f"quadrature must be one of {', '.join(QUADRATURES)}; got {quadrature!r}")
    least = 2 if quadrature == "riemann_trapezoid" else 1
    if steps < least:
        raise OptionError(f"{quadrature} takes steps >= {least}; got {steps}")
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


@register_method("integrated_gradients", needs={Need.PATH_GRADIENTS}, class_specific=True)
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
