"""Misuse of the API gets an ExplainError that says what to do, never a raw torch error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from explain import Explainer, OptionError, TargetError
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
