"""How a method's values are shown to a reader: as computed, or normalised per map with
a note saying why, for the methods whose raw values mislead as numbers
(`Method.scale_note`)."""

from __future__ import annotations

import torch
from torch import Tensor

from explain.rules.registry import get_method

__all__ = ["display_values", "scale_note"]


def display_values(method: str, relevance: Tensor, raw: bool = False) -> Tensor:
    """Relevance (..., T) as it is shown to a reader: as computed, or, for a method with a
    `scale_note` (unless `raw`), divided by each map's largest magnitude, so that it lies
    in [-1, 1] with its signs and ratios kept."""
    if raw or get_method(method).scale_note is None:
        return relevance
    largest = relevance.abs().amax(dim=-1, keepdim=True)
    return relevance / largest.clamp(min=torch.finfo(relevance.dtype).tiny)


def scale_note(method: str, raw: bool = False) -> str | None:
    """The note to show next to `method`'s values: its `scale_note`, and how the values
    are shown (normalised per map, or as computed with `raw`); None when the method's
    values can be read as they are."""
    note = get_method(method).scale_note
    if note is None:
        return None
    shown = "as computed" if raw else "divided by each map's largest magnitude"
    return f"{method}: {note}; values shown {shown}"
