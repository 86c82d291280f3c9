"""The suite's rule for comparing floats (tests/tolerances.py), as conftest.py installs it:
a float32 comparison tighter than float32 keeps raises on every machine, whether or not the
values agree on this one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tolerances import ToleranceError, assert_float32_close

SCALE = 3.0  # the values' largest magnitude


def _values(dtype=torch.float32) -> torch.Tensor:
    return torch.linspace(-SCALE, SCALE, 7, dtype=dtype)


def test_a_float32_comparison_at_torch_s_defaults_raises_though_the_values_are_equal():
    values = _values()
    with pytest.raises(ToleranceError, match=r"rtol=1\.3e-06, atol=1e-05"):
        torch.testing.assert_close(values, values.clone())


def test_the_originally_reported_comparison_raises_on_every_machine():
    # issue 37: test_vision_language's fused path against its explicit path compared float32
    # at rtol 1e-5, and failed on a CPU whose rounding differed by 1.07e-5
    values = _values()
    with pytest.raises(ToleranceError, match=r"float32 keeps rtol 0\.0001 only"):
        torch.testing.assert_close(values, values * (1 + 5e-6), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_reported_difference_is_within_what_float32_keeps_and_a_wrong_map_is_not(dtype):
    # the case's float64 model computes its eager softmax in float32: compared since at
    # assert_float32_close, which the 1.07e-5 difference keeps and 1e-3 does not
    values = _values(dtype)
    assert_float32_close(values * (1 + 1.07e-5), values)
    small = values.clone()
    small[3] = 5e-7 * SCALE  # a sum of cancelling terms, off by its own size
    assert_float32_close(small, small.clone().index_fill_(0, torch.tensor(3), 0.0))
    with pytest.raises(AssertionError):
        assert_float32_close(values * (1 + 1e-3), values)


def test_float64_at_1e_10_float32_at_rtol_1e_4_and_exact_comparisons_pass():
    torch.testing.assert_close(_values(torch.float64), _values(torch.float64), rtol=1e-10, atol=0)
    torch.testing.assert_close(_values(torch.float64), _values(torch.float64))  # its defaults
    torch.testing.assert_close(_values(), _values() * (1 + 5e-5), rtol=1e-4, atol=0)
    torch.testing.assert_close(_values(), _values(), rtol=0, atol=0)


def test_an_atol_counts_at_the_values_scale():
    values = _values()
    torch.testing.assert_close(values, values, rtol=0, atol=1e-4 * SCALE)
    with pytest.raises(ToleranceError, match="at a scale of 3"):
        torch.testing.assert_close(values, values, rtol=0, atol=1e-5 * SCALE)


def test_float32_against_a_float64_reference_is_held_to_float32():
    with pytest.raises(ToleranceError, match=r"torch\.float32 values"):
        torch.testing.assert_close(_values(), _values(torch.float64), rtol=1e-9, atol=0)


@pytest.mark.parametrize(
    "compare",
    [
        lambda a, b: torch.allclose(a, b),
        lambda a, b: a.allclose(b, rtol=1e-6),
        lambda a, b: torch.isclose(a, b, 1e-5, 1e-8),
        lambda a, b: np.testing.assert_allclose(a.numpy(), b.numpy()),
        lambda a, b: np.allclose(a.numpy(), b.numpy(), rtol=1e-5),
    ],
    ids=["torch.allclose", "Tensor.allclose", "torch.isclose", "assert_allclose", "np.allclose"],
)
def test_every_comparison_function_is_checked(compare):
    values = _values()
    with pytest.raises(ToleranceError):
        compare(values, values.clone())
    compare(values.double(), values.double())  # float64: its defaults are fine


def test_an_answer_of_not_close_is_not_a_float32_edge():
    # `assert not torch.allclose(...)` says two results differ: no tolerance is too tight
    assert not torch.allclose(_values(), _values() + 1)
    assert not np.allclose(_values().numpy(), _values().numpy() + 1)


def test_numpy_views_and_arrays_without_floats():
    values = _values().numpy()[::-1]  # a view that steps backwards
    with pytest.raises(ToleranceError, match="at a scale of 3"):
        np.testing.assert_allclose(values, values.copy(), rtol=1e-6)
    np.testing.assert_allclose(np.arange(3), np.arange(3))  # integers: nothing rounds


def test_a_tolerance_error_is_no_assertion_error():
    # a test that expects the values to differ (pytest.raises(AssertionError)) must not take
    # a too-tight comparison for the difference it looks for
    with pytest.raises(ToleranceError), pytest.raises(AssertionError):
        torch.testing.assert_close(_values(), _values() + 1, rtol=1e-6, atol=0)


def test_library_code_s_own_comparisons_are_not_checked():
    # only calls from files in tests/ are tests' comparisons (explain's own checks, such as
    # a custom model's post-softmax test, compare at what they need)
    code = compile("torch.allclose(values, values.clone())", "/elsewhere/library.py", "exec")
    exec(code, {"torch": torch, "values": _values()})
