"""The suite's rule for comparing floats, checked on every comparison a test makes.

A float32 result is compared at rtol 1e-4 or looser (or at an atol that is as much at the
scale of the values: `atol + rtol * max|values| >= 1e-4 * max|values|`), or exactly (`rtol=0,
atol=0`) where the same computation runs twice on the same inputs. A result that must
agree more closely is computed in float64 and compared at about 1e-10. Why: float32 keeps
about seven digits and a sum over a few hundred terms loses one or two of them, in an order
that differs between batched and single, fused and explicit, chunked and whole, between
thread counts, BLAS libraries (MKL, OpenBLAS, Accelerate) and vector units (AVX-512,
NEON); a float32 tolerance near 1e-5 holds on the CPU it was written on and fails on
another. Keep each tolerance far below what a wrong rule changes (a wrong rule moves
values by a good fraction of their scale).

`install()` (called by conftest.py) wraps `torch.testing.assert_close`, `torch.allclose`,
`Tensor.allclose`, `torch.isclose`, `numpy.testing.assert_allclose` and `numpy.allclose`:
a call from a file in tests/ that compares float32 (or half-precision) values tighter than
the rule raises `ToleranceError`, on every machine, whether or not the values happen to
agree here. `allclose` and `isclose` are checked only when they answer "close" (an
`assert not torch.allclose(...)` that two results differ is not a float32 edge).
`pytest.approx` compares Python floats, whose dtype is gone: keep those float64 or
loose by hand.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_leaves

FLOAT32_RTOL = 1e-4
"""The least relative tolerance a comparison of float32 (or less precise) values may use."""

FLOAT32 = {"rtol": FLOAT32_RTOL, "atol": 1e-6}
"""Two float32 computations that sum in different orders (a batch and each input alone, a
fused and an explicit path): what float32 keeps."""

FLOAT64 = {"rtol": 1e-10, "atol": 1e-13}
"""A float64 computation against its float64 reference: float64's rounding."""

_TESTS = str(Path(__file__).resolve().parent)

# torch.testing.assert_close's defaults when neither rtol nor atol is given
_TORCH_DEFAULTS = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
}


def assert_float32_close(
    actual: torch.Tensor, expected: torch.Tensor, *, of_scale: float = 1e-6
) -> None:
    """`actual` equals `expected` as float32 keeps, whatever their dtype (a float64 model
    whose eager softmax transformers computes in float32 is float32 there): rtol 1e-4, and
    `of_scale` of the largest magnitude for the small entries that are sums of cancelling
    terms."""
    scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
    torch.testing.assert_close(actual, expected, rtol=FLOAT32_RTOL, atol=of_scale * scale)


class ToleranceError(Exception):
    """A float32 comparison tighter than the suite's rule (not an AssertionError, so that
    no `pytest.raises(AssertionError)` can take it for the difference it looks for)."""


def _low_precision(values: Any) -> tuple[torch.dtype | None, float]:
    """The least precise floating dtype below float64 among `values`' tensors and arrays
    (None if there is none) and the largest finite magnitude among them."""
    dtype, scale = None, 0.0
    for leaf in tree_leaves(values):
        if isinstance(leaf, np.ndarray | np.generic):
            if leaf.dtype not in (np.float16, np.float32, np.float64):
                continue  # integers, booleans, objects: nothing rounds
            leaf = torch.from_numpy(np.ascontiguousarray(leaf))  # a view may step backwards
        if not isinstance(leaf, torch.Tensor) or not leaf.is_floating_point():
            continue
        if leaf.numel():
            finite = leaf.detach()[torch.isfinite(leaf.detach())]
            if finite.numel():
                scale = max(scale, float(finite.abs().max()))
        if leaf.dtype != torch.float64 and (
            dtype is None or torch.finfo(leaf.dtype).eps > torch.finfo(dtype).eps
        ):
            dtype = leaf.dtype
    return dtype, scale


def check(actual: Any, expected: Any, rtol: float | None, atol: float | None) -> None:
    """Raise ToleranceError if comparing `actual` with `expected` at (rtol, atol) breaks
    the rule; None for both means torch.testing.assert_close's defaults for the dtype."""
    dtype, scale = _low_precision(actual)
    other, expected_scale = _low_precision(expected)
    if dtype is None or (other is not None and torch.finfo(other).eps > torch.finfo(dtype).eps):
        dtype = other
    scale = max(scale, expected_scale)
    if dtype is None:
        return
    if rtol is None and atol is None:
        rtol, atol = _TORCH_DEFAULTS.get(dtype, (0.0, 0.0))
    rtol, atol = float(rtol or 0.0), float(atol or 0.0)
    if rtol == 0.0 and atol == 0.0:
        return  # exact: the same computation twice
    if atol + rtol * scale >= FLOAT32_RTOL * scale:
        return
    raise ToleranceError(
        f"{dtype} values compared at rtol={rtol:g}, atol={atol:g} (at a scale of {scale:.3g}): "
        f"float32 keeps rtol {FLOAT32_RTOL:g} only. Loosen the tolerance to rtol "
        f"{FLOAT32_RTOL:g}, compare exactly (rtol=0, atol=0) if the same computation ran "
        "twice, or compute in float64 and compare at 1e-10 (tests/tolerances.py)"
    )


def _from_a_test() -> bool:
    """Whether the wrapped function was called from a file in tests/ (library code's own
    checks, such as the post-softmax test of a custom model's attention, are not tests)."""
    return sys._getframe(2).f_code.co_filename.startswith(_TESTS)


def _checked_assert(compare, defaults: tuple[float, float] | None):
    """`compare(actual, expected, rtol=, atol=)` checked first; `defaults` are its own
    (rtol, atol) when it has fixed ones (numpy), None for torch's per-dtype defaults."""

    @functools.wraps(compare)
    def checked(actual, expected, *args, **kwargs):
        if _from_a_test():
            rtol, atol = _tolerances(args, kwargs, defaults)
            check(actual, expected, rtol, atol)
        return compare(actual, expected, *args, **kwargs)

    return checked


def _checked_close(compare, defaults: tuple[float, float]):
    """`compare(a, b, rtol, atol)` returning a bool or a boolean tensor, checked when it
    answers "close" everywhere."""

    @functools.wraps(compare)
    def checked(a, b, *args, **kwargs):
        answer = compare(a, b, *args, **kwargs)
        if _from_a_test():
            close = answer.all() if isinstance(answer, torch.Tensor) else np.all(answer)
            if bool(close):
                check(a, b, *_tolerances(args, kwargs, defaults))
        return answer

    return checked


def _tolerances(args: tuple, kwargs: dict, defaults: tuple[float, float] | None):
    """(rtol, atol) of a call whose positional arguments after the two compared are
    (rtol, atol, ...) in numpy and torch.allclose, keywords only in assert_close."""
    rtol = kwargs.get("rtol", args[0] if len(args) > 0 else None)
    atol = kwargs.get("atol", args[1] if len(args) > 1 else None)
    if defaults is not None:
        rtol = defaults[0] if rtol is None else rtol
        atol = defaults[1] if atol is None else atol
    return rtol, atol


def install() -> None:
    """Check every float comparison the tests make against the rule (for the session)."""
    torch.testing.assert_close = _checked_assert(torch.testing.assert_close, None)
    np.testing.assert_allclose = _checked_assert(np.testing.assert_allclose, (1e-7, 0.0))
    torch.allclose = _checked_close(torch.allclose, (1e-5, 1e-8))
    torch.Tensor.allclose = _checked_close(torch.Tensor.allclose, (1e-5, 1e-8))
    torch.isclose = _checked_close(torch.isclose, (1e-5, 1e-8))
    np.allclose = _checked_close(np.allclose, (1e-5, 1e-8))
