"""Non-finite inputs, outputs, scores and relevance are refused with the samples named."""

from __future__ import annotations

import pytest
import torch
from op_counts import count_ops

from explain import Explainer, ExplainError, InputError
from explain.explanation import Explanation
from explain.finite import all_finite
from explain.testing import ModelState, tiny_vit
from explain.viz.text import to_html


@pytest.mark.parametrize("method", ["generic", "rollout", "transformer_attribution", "lrp"])
def test_overflowing_logits_are_refused_naming_the_sample(method):
    model = tiny_vit()
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    images[1] *= 1e30  # finite, but the model's float32 arithmetic overflows
    before = ModelState.capture(model)
    with pytest.raises(InputError, match=r"the model's output of samples 1 is not finite"):
        Explainer(model).explain(images, method=method)
    assert before.differences(ModelState.capture(model)) == []


def test_values_finite_in_float32_that_overflow_float16_are_refused():
    model = tiny_vit().half()
    images = torch.randn(2, 3, 32, 32)
    images[0, 0, 0, 0] = 1e5  # finite in float32, infinite in float16
    with pytest.raises(InputError, match=r"as the model's torch.float16.* of samples 0 is not"):
        Explainer(model).explain(images)


def test_nan_images_are_refused():
    images = torch.randn(4, 3, 32, 32)
    images[2, 1, 3, 3] = float("nan")
    with pytest.raises(InputError, match="samples 2 is not finite"):
        Explainer(tiny_vit()).explain(images)


def test_non_finite_scores_of_a_target_callable_are_refused():
    images = torch.randn(2, 3, 32, 32)
    with pytest.raises(InputError, match="score the target callable returned of samples 0, 1"):
        Explainer(tiny_vit()).explain(images, target=lambda out: out[:, 0] / 0.0)


def test_non_finite_relevance_is_refused():
    """Finite logits and scores whose gradient is not finite: sqrt'(0) is infinite."""
    images = torch.randn(2, 3, 32, 32)
    with pytest.raises(ExplainError, match="the generic relevance of samples 0, 1 is not"):
        Explainer(tiny_vit()).explain(
            images, target=lambda out: (out[:, 0] - out[:, 0].detach()).sqrt()
        )


def test_no_explanation_with_nan_can_be_drawn():
    relevance = torch.rand(2, 4, 4)
    relevance[1, 2, 2] = float("nan")
    with pytest.raises(ExplainError, match="samples 1 is not finite"):
        Explanation(
            relevance=relevance,
            logits=torch.zeros(2, 3),
            target=torch.zeros(2, dtype=torch.long),
            method="generic",
            score="logit",
            input_size=(32, 32),
        )
    with pytest.raises(InputError, match="NaN"):
        to_html(["good", "film"], [0.5, float("nan")])


def test_all_finite_waits_for_the_device_once_for_every_tensor():
    values = [torch.ones(3), torch.zeros(2, 2), torch.arange(3), torch.empty(0)]
    assert count_ops(lambda: all_finite(values)).syncs == 1
    assert all_finite(values) and all_finite([])
    assert not all_finite([*values, torch.tensor([1.0, float("inf")])])
    assert not all_finite([torch.tensor([[float("nan")]]), *values])


def test_a_non_finite_second_relevance_is_refused_by_name():
    relevance = torch.zeros(2, 3)
    broken = torch.zeros(2, 4)
    broken[1, 2] = float("nan")
    with pytest.raises(ExplainError, match="samples 1 is not finite"):
        Explanation(
            relevance=relevance,
            logits=torch.zeros(2, 5),
            target=torch.zeros(2, dtype=torch.long),
            method="generic",
            score="logit",
            relevances={"source": relevance, "target": broken},
        )
