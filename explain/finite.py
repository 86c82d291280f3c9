"""Non-finite numbers are refused, never explained or drawn.

A NaN or infinite input, logit, score or relevance value would otherwise pass through
every method unnoticed (argmax of NaN logits is class 0, min-max normalisation turns NaN
maps into zeros, a colour scale shows NaN at full strength). Each check names the samples
it refuses, so that a user can find the offending inputs in a batch.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from explain.errors import ExplainError, InputError

__all__ = ["all_finite", "check_finite", "nonfinite_error", "nonfinite_samples"]


def _finite(values: Tensor) -> Tensor:
    """Elementwise finiteness of floating-point `values`; float8 types have no isfinite
    kernel, so they are widened first (exactly: float32 holds every float8 value)."""
    values = values.detach()
    return (values.float() if values.element_size() == 1 else values).isfinite()


def all_finite(values: Iterable[Tensor]) -> bool:
    """Whether every value of every tensor is finite, read from the device once for all of
    them (`check_finite` then names the samples, on the rare path where one is not)."""
    flags = [_finite(v).all() for v in values if v.is_floating_point() and v.numel()]
    return not flags or bool(torch.stack(flags).all())


def nonfinite_samples(values: Tensor) -> list[int]:
    """Indices along the first axis of the samples that hold a NaN or infinite value."""
    if values.numel() == 0 or not values.is_floating_point():
        return []
    bad = ~_finite(values).reshape(values.shape[0], -1).all(dim=1)
    return bad.nonzero().flatten().tolist()


def nonfinite_error(
    values: Tensor, what: str, advice: str, error: type[ExplainError] = InputError
) -> ExplainError | None:
    """The `error` that `check_finite` raises for `values`, or None where every value is
    finite: for a caller that has read the finiteness with other checks at once."""
    samples = nonfinite_samples(values)
    if not samples:
        return None
    listed = ", ".join(map(str, samples[:10])) + (", ..." if len(samples) > 10 else "")
    return error(f"{what} of samples {listed} is not finite (NaN or infinite); {advice}")


def check_finite(
    values: Tensor, what: str, advice: str, error: type[ExplainError] = InputError
) -> None:
    """Raise `error` if `values` (samples along the first axis) hold NaN or infinity.

    The message reads "`what` of samples I, J is not finite (NaN or infinite); `advice`".
    """
    found = nonfinite_error(values, what, advice, error)
    if found is not None:
        raise found
