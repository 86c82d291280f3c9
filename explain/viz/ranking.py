"""What a predicted token rests on most: the one ranking every view of a language model's
prediction shows, in the same order with the same values (the terminal's lines, the
generation page and figure, the answer page about a photo, `explain text`'s lines).

Tokens are ranked by |relevance|: on a signed map, evidence against the prediction
(negative) weighs as much as evidence for it, and a distractor strongly against the answer
is named, with its sign. Only the tokens read before the readout token (the one the
prediction is read out at) compete: every rule gives the readout token its own identity
term, which would top almost every ranking and say nothing about the rest (the figures
hatch it, off the scale, for the same reason).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import Tensor

__all__ = ["rests_on", "sources_text"]


def rests_on(row: Tensor | np.ndarray | Sequence[float], readout: int, count: int = 3) -> list[int]:
    """The positions of the `count` tokens of `row` with the largest |relevance| among
    those before position `readout`, largest first (ties: the earlier token first). A
    `readout` past the end of `row` leaves every position in."""
    before = [float(v) for v in row[: max(readout, 0)]]
    order = sorted(range(len(before)), key=lambda t: (-abs(before[t]), t))
    return order[:count]


def sources_text(
    tokens: Sequence[str], row: Tensor | np.ndarray | Sequence[float], positions: Sequence[int]
) -> str:
    """The ranked `positions` (`rests_on`) as every view writes them: `'token'@position
    value`, comma-separated, the token as Python's repr (spaces and control characters
    stay visible), the position its index in `tokens`, the value signed as computed;
    "nothing read before it" when there are none."""
    entries = [f"{tokens[t]!r}@{t} {float(row[t]):.3g}" for t in positions]
    return ", ".join(entries) or "nothing read before it"
