"""explain.evaluation.quantus.explain_func: Quantus's convention (numpy images and labels
in, numpy (B, 1, H, W) maps out) for image classifiers, and a Quantus metric run end to
end on a tiny ViT against an independent computation of its score."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from explain import Explainer, InputError, UnsupportedModelError
from explain.evaluation.quantus import explain_func
from explain.testing import ModelState, tiny_lm, tiny_vit

quantus = pytest.importorskip("quantus", reason="the Quantus bridge needs the quantus extra")


def _batch():
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(4, 3, 32, 32, generator=generator)
    return images.numpy(), np.array([0, 1, 2, 3])


@pytest.mark.parametrize("method", ["generic", "rollout", "lrp"])
def test_the_maps_are_the_explanations_at_the_input_size(method):
    model = tiny_vit().eval()
    images, labels = _batch()
    before = ModelState.capture(model)
    maps = explain_func(model, images, labels, method=method)
    assert before.differences(ModelState.capture(model)) == []
    assert maps.shape == (4, 1, 32, 32) and maps.dtype == np.float32
    expected = Explainer(model).explain(
        torch.from_numpy(images), target=torch.from_numpy(labels), method=method
    )
    assert np.array_equal(maps[:, 0], expected.heatmap(normalize=False).numpy())


def test_each_label_is_the_explained_class_and_one_label_serves_the_batch():
    model = tiny_vit().eval()
    images, labels = _batch()
    maps = explain_func(model, images, labels)
    for index, label in enumerate(labels):
        alone = explain_func(model, images[index : index + 1], int(label))
        np.testing.assert_allclose(alone[0], maps[index], rtol=1e-4, atol=1e-6)
    same = explain_func(model, images, 2)
    np.testing.assert_array_equal(same, explain_func(model, images, np.full(4, 2)))
    assert not np.allclose(same, maps)


def test_pointing_game_end_to_end_scores_whether_the_maps_peak_in_the_masks():
    """Quantus's PointingGame with masks on the pixels where each map peaks (samples 0
    and 2) or on every other pixel (1 and 3): hits and misses as the maps themselves say
    (a hit: a pixel of the map's maximum lies in the mask)."""
    model = tiny_vit().eval()
    images, labels = _batch()
    maps = explain_func(model, images, labels, method="generic")[:, 0]
    masks = np.zeros((4, 1, 32, 32), dtype=np.float32)
    for index, heat in enumerate(maps):
        peak = heat == heat.max()
        masks[index, 0] = peak if index % 2 == 0 else ~peak
    metric = quantus.PointingGame(disable_warnings=True)
    scores = metric(
        model=model,
        x_batch=images,
        y_batch=labels,
        s_batch=masks,
        explain_func=explain_func,
        explain_func_kwargs={"method": "generic"},
        device="cpu",
    )
    assert [bool(score) for score in scores] == [True, False, True, False]


def test_other_models_and_inputs_are_refused():
    language_model = tiny_lm.tiny_causal_lm("llama")
    with pytest.raises(UnsupportedModelError, match="is for image classifiers"):
        explain_func(language_model, np.zeros((1, 3, 32, 32)), np.array([0]))
    with pytest.raises(InputError, match=r"images \(B, C, H, W\)"):
        explain_func(tiny_vit().eval(), np.zeros((3, 32, 32)), np.array([0]))
