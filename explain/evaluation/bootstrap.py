"""Bootstrap standard errors, and which methods are tied with the best within noise.

Every summary number of a protocol is a function of the per-example records of all the
examples (`EvaluationProtocol.summarize`). Drawing the examples again with replacement,
ROUNDS times, and summarising each draw gives the number's bootstrap distribution; its
standard deviation is the standard error printed next to the number.

All methods of a run are scored on the same examples, so every method is resampled with
the SAME draws: on one draw, the difference between two methods is a paired replicate of
their difference. A method is tied with the best within noise when the central LEVEL
share of those paired differences contains 0. Pairing matters: two methods that fail on
the same hard examples can differ by far less than either one's standard error suggests.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from explain.evaluation.protocol import Records

__all__ = [
    "LEVEL",
    "ROUNDS",
    "replicates",
    "resample",
    "resample_indices",
    "standard_error",
    "tied_with_best",
]

ROUNDS = 1000
"""Bootstrap draws per run."""

LEVEL = 0.95
"""Coverage of the interval of paired differences that decides a tie."""


def resample_indices(count: int, rounds: int = ROUNDS, seed: int = 0) -> Tensor:
    """(rounds, count) example indices drawn with replacement, the same for every method
    of a run (they depend only on `count`, `rounds` and `seed`)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(count, (rounds, count), generator=generator)


def resample(records: Records, indices: Sequence[int]) -> Records:
    """The records of the examples at `indices` (repeats included), in that order."""
    return {key: [values[i] for i in indices] for key, values in records.items()}


def replicates(
    summarize: Callable[[Records], Mapping[str, Any]],
    records: Records,
    keys: Collection[str],
    indices: Tensor,
) -> dict[str, Tensor]:
    """Each summary number in `keys`, once per draw: key -> (rounds,) float64."""
    rows = [summarize(resample(records, draw.tolist())) for draw in indices]
    return {key: torch.tensor([row[key] for row in rows], dtype=torch.float64) for key in keys}


def standard_error(values: Tensor) -> float:
    """The standard deviation of a number's bootstrap replicates."""
    return float(values.std(correction=1))


def tied_with_best(
    values: Mapping[str, float],
    draws: Mapping[str, Tensor],
    better: Literal["higher", "lower"],
    level: float = LEVEL,
) -> list[str]:
    """The method with the best value and every method within noise of it, in the order
    of `values`.

    `draws[m]` are method m's replicates on the shared draws; m is within noise when the
    central `level` share of `draws[m] - draws[best]` contains 0.
    """
    pick = max if better == "higher" else min
    best = pick(values, key=values.__getitem__)
    tail = (1.0 - level) / 2
    bounds = torch.tensor([tail, 1.0 - tail], dtype=torch.float64)
    tied = []
    for method in values:
        difference = (draws[method] - draws[best]).double()
        low, high = torch.quantile(difference, bounds).tolist()
        if low <= 0.0 <= high:
            tied.append(method)
    return tied
