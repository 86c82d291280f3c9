"""Misuse of the API gets an ExplainError that says what to do, never a raw torch error."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from explain import Explainer, OptionError, TargetError, UnknownMethodError
from explain.testing import ModelState


@pytest.mark.parametrize(
    "target",
    [
        lambda logits: logits[:, 0].detach(),
        lambda logits: torch.ones(logits.shape[0], requires_grad=True),
    ],
    ids=["detached", "unrelated"],
)
@pytest.mark.parametrize("method", ["generic", "attention_gradcam"])
def test_scores_without_the_models_graph_are_refused(vit, images, target, method):
    before = ModelState.capture(vit)
    with pytest.raises(TargetError, match="must be computed from the model output"):
        Explainer(vit).explain(images, target=target, method=method)
    with pytest.raises(TargetError, match="must be computed from the model output"):
        Explainer(vit).trace(images, target=target)
    assert before.differences(ModelState.capture(vit)) == []


@pytest.mark.parametrize("size", [0, -3, (0, 5), (5, 0), 2.5, (2.5, 3), (3,), (1, 2, 3), True])
def test_bad_heatmap_sizes_are_refused(vit, images, size):
    result = Explainer(vit).explain(images)
    with pytest.raises(OptionError, match="heatmap size must be a positive int or a"):
        result.heatmap(size)


def test_integer_like_heatmap_sizes_are_accepted(vit, images):
    result = Explainer(vit).explain(images)
    assert result.heatmap(np.int64(7)).shape == (2, 7, 7)
    assert result.heatmap([5, np.int32(9)]).shape == (2, 5, 9)


def test_integer_like_start_layers_are_accepted_like_targets(vit, images):
    explainer = Explainer(vit)
    expected = explainer.explain(images, start_layer=1, target=2).relevance
    for start in (np.int64(1), np.int32(1), torch.tensor(1)):
        found = explainer.explain(images, start_layer=start, target=np.int64(2))
        torch.testing.assert_close(found.relevance, expected, rtol=0, atol=0)
    for bad in (1.0, True, "1", np.float32(1)):
        with pytest.raises(OptionError, match="start_layer must be an int"):
            explainer.explain(images, start_layer=bad)


def test_unknown_options_list_the_methods_options(vit, images):
    with pytest.raises(OptionError, match=r"'generic' has no option 'foo'; it takes no options"):
        Explainer(vit).explain(images, foo=1)
    with pytest.raises(OptionError, match=r"no option 'fusion'.*seed=0"):
        Explainer(vit).explain(images, method="random", fusion="max")


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"target": 2**70}, TargetError, "target class 1180591620717411303424 is out of range"),
        ({"target": -(2**70)}, TargetError, "is out of range"),
        ({"target": [2**70, 1]}, TargetError, "target class 1180591620717411303424 is out of"),
        ({"target": {1, 2}}, TargetError, "got a set"),
        ({"target": {0: 1, 1: 2}}, TargetError, "got a dict"),
        ({"target": torch.tensor([1 + 0j, 2 + 0j])}, TargetError, "integers, got torch.complex64"),
        ({"method": 3}, UnknownMethodError, "method must be a method name"),
        ({"method": ["generic"]}, UnknownMethodError, "method must be a method name"),
        (
            {"method": "rollout", "discard_ratio": "0.5"},
            OptionError,
            "discard_ratio of 'rollout' must be a number",
        ),
        (
            {"method": "rollout", "head_fusion": 1},
            OptionError,
            "head_fusion of 'rollout' must be one of",
        ),
        ({"method": "random", "seed": "x"}, OptionError, "seed of 'random' must be an int"),
        ({"method": "random", "seed": 1.5}, OptionError, "seed of 'random' must be an int"),
        ({"method": "random", "seed": 2**70}, OptionError, "seed of 'random' must be an int"),
        ({"method": "random", "seed": True}, OptionError, "seed of 'random' must be an int"),
    ],
)
def test_options_of_the_wrong_type_are_clear_errors(vit, images, options, error, message):
    before = ModelState.capture(vit)
    with pytest.raises(error, match=re.escape(message) if "(" in message else message):
        Explainer(vit).explain(images, **options)
    assert before.differences(ModelState.capture(vit)) == []


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("circle", "target 'circle' names classes; explain takes class indices"),
        (["circle", 0], "names classes; explain takes class indices"),
        ([[1], [2, 3]], "cannot read target [[1], [2, 3]] as class indices: give an int,"),
        ([None, 1], "cannot read target [None, 1] as class indices: give an int,"),
    ],
)
def test_a_target_that_is_not_class_indices_says_what_to_give(vit, images, target, message):
    # A class name (the command line's --target takes names, explain class indices) or a
    # ragged or untyped list: the error says what explain takes and how to get there,
    # in its own words, not PyTorch's ("new(): invalid data type 'str'").
    with pytest.raises(TargetError) as raised:
        Explainer(vit).explain(images, target=target)
    text = str(raised.value)
    assert message in text
    assert "classes.index" in text or "a callable" in text
    assert not any(torch_words in text for torch_words in ("new()", "dim 1", "infer dtype"))


def test_options_of_the_right_kind_are_accepted_in_any_integer_or_real_type(vit, images):
    explainer = Explainer(vit)
    expected = explainer.explain(images, method="random", seed=3).relevance
    assert torch.equal(
        explainer.explain(images, method="random", seed=np.int64(3)).relevance, expected
    )
    ratio = explainer.explain(images, method="rollout", discard_ratio=0.5).relevance
    for same in (np.float32(0.5), 0.5):
        found = explainer.explain(images, method="rollout", discard_ratio=same).relevance
        torch.testing.assert_close(found, ratio)


def test_a_target_callable_returning_complex_scores_is_refused(vit, images):
    with pytest.raises(TargetError, match=r"real scores or class indices, got torch\.complex64"):
        Explainer(vit).explain(
            images, target=lambda logits: torch.complex(logits[:, 0], logits[:, 0])
        )
