"""Bootstrap standard errors, and which methods are tied with the best within noise.

Every ranking number of a protocol is a function of sums over the examples of per-example
terms (`EvaluationProtocol.terms` and `from_sums`). Drawing the examples again with
replacement, ROUNDS times, re-weights those sums by how often each example was drawn, and
the number's values over the draws are its bootstrap distribution; their standard
deviation is the standard error printed next to the number. The draws are weight
matrices applied to the terms in chunks, so 50 000 ImageNet images cost seconds, not the
hours of summarising 1000 resampled copies of the records.

All methods of a run are scored on the same examples, so every method is resampled with
the SAME draws (they depend only on the number of examples and the seed): on one draw,
the difference between two methods is a paired replicate of their difference. A method
is tied with the best within noise when the central LEVEL share of those paired
differences contains 0. Pairing matters: two methods that fail on the same hard examples
can differ by far less than either one's standard error suggests.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Literal

import torch
from torch import Tensor

from explain.evaluation.protocol import EvaluationProtocol, Records

__all__ = [
    "LEVEL",
    "ROUNDS",
    "draws",
    "replicates",
    "standard_error",
    "tied_with_best",
]

ROUNDS = 1000
"""Bootstrap draws per run."""

LEVEL = 0.95
"""Coverage of the interval of paired differences that decides a tie."""


_CHUNK_ELEMENTS = 1 << 22
"""Most (draw, example) weights held at once: 32 MiB of float64."""


def draws(count: int, rounds: int = ROUNDS, seed: int = 0) -> Iterator[Tensor]:
    """The example indices of each draw, with replacement: (rows, count) chunks that
    together hold `rounds` rows, the same for every call with the same arguments."""
    generator = torch.Generator().manual_seed(seed)
    rows = max(1, _CHUNK_ELEMENTS // max(count, 1))
    for start in range(0, rounds, rows):
        yield torch.randint(count, (min(rows, rounds - start), count), generator=generator)


def replicates(
    protocol: EvaluationProtocol,
    records: Records,
    keys: Collection[str],
    rounds: int = ROUNDS,
    seed: int = 0,
) -> dict[str, Tensor]:
    """Each ranking number in `keys`, once per draw: key -> (rounds,) float64."""
    terms = protocol.terms(records)
    names = list(terms)
    matrix = torch.stack([terms[name] for name in names], dim=1)  # (examples, terms)
    count = len(matrix)
    pieces: dict[str, list[Tensor]] = {key: [] for key in keys}
    for indices in draws(count, rounds, seed):
        weights = torch.zeros(len(indices), count, dtype=torch.float64)
        weights.scatter_add_(1, indices, torch.ones_like(indices, dtype=torch.float64))
        sums = weights @ matrix  # (rows, terms): each draw's sums
        numbers = protocol.from_sums({name: sums[:, j] for j, name in enumerate(names)}, count)
        for key in keys:
            pieces[key].append(numbers[key])
    return {key: torch.cat(parts) for key, parts in pieces.items()}


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
