"""Pictures: overlays, figures, grids and text figures draw what they are given."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from matplotlib import colormaps
from PIL import Image

from explain import Explainer
from explain.errors import ExplainError, InputError
from explain.testing import tiny_vit
from explain.viz import (
    batch_figure,
    explanation_grid,
    grid_figure,
    heatmap_figure,
    overlay,
    save_figure,
    save_image,
    text_figure,
)


@pytest.fixture
def picture():
    generator = torch.Generator().manual_seed(3)
    return torch.rand(3, 32, 48, generator=generator), torch.rand(32, 48, generator=generator)


def test_overlay_blends_the_colormap_over_the_image_by_alpha(picture):
    image, heat = picture
    rgb = image.permute(1, 2, 0).numpy()
    colored = colormaps["inferno"](heat.numpy())[..., :3]
    assert np.allclose(overlay(image, heat, cmap="inferno", alpha=0.0), rgb)
    assert np.allclose(overlay(image, heat, cmap="inferno", alpha=1.0), colored)
    blended = overlay(image, heat, cmap="inferno", alpha=0.3)
    assert blended.shape == (32, 48, 3)
    assert np.allclose(blended, 0.7 * rgb + 0.3 * colored)


def test_overlay_accepts_channels_last_and_grey_images(picture):
    image, heat = picture
    channels_last = overlay(image.permute(1, 2, 0).numpy(), heat)
    assert np.allclose(channels_last, overlay(image, heat))
    grey = overlay(image[0].numpy(), heat, alpha=0.0)
    assert np.allclose(grey, np.repeat(image[0].numpy()[..., None], 3, axis=-1))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(alpha=1.5), ExplainError, "alpha"),
        (dict(cmap="no-such-map"), ExplainError, "colormap"),
    ],
)
def test_overlay_rejects_bad_style(picture, kwargs, error, message):
    with pytest.raises(error, match=message):
        overlay(*picture, **kwargs)


def test_overlay_names_the_fix_for_a_heatmap_of_the_wrong_size(picture):
    image, _ = picture
    with pytest.raises(InputError, match=r"heatmap\(size="):
        overlay(image, torch.rand(4, 6))


def test_save_image_writes_a_png_of_the_image_size(picture, tmp_path):
    image, heat = picture
    blended = overlay(image, heat)
    save_image(blended, tmp_path / "out" / "blend.png")
    with Image.open(tmp_path / "out" / "blend.png") as saved:
        assert saved.format == "PNG"
        assert saved.size == (48, 32)
        pixels = np.asarray(saved, dtype=np.float32) / 255.0
    assert np.abs(pixels - blended).max() <= 0.5 / 255.0 + 1e-6
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["blend.png"]


def test_save_figure_writes_figure_size_times_dpi(picture, tmp_path):
    figure = heatmap_figure(*picture, title="a map")
    width, height = save_figure(figure, tmp_path / "figure.png", dpi=80)
    inches = figure.get_size_inches()
    assert abs(width - inches[0] * 80) <= 1 and abs(height - inches[1] * 80) <= 1
    with Image.open(tmp_path / "figure.png") as saved:
        assert saved.size == (width, height)


def test_save_figure_leaves_nothing_behind_when_rendering_fails(picture, tmp_path):
    figure = heatmap_figure(*picture)
    with pytest.raises(ValueError):
        save_figure(figure, tmp_path / "figure.png", dpi=-5)
    assert list(tmp_path.iterdir()) == []


def test_heatmap_figure_colorbar_is_optional(picture):
    assert len(heatmap_figure(*picture, colorbar=True).axes) == 2
    assert len(heatmap_figure(*picture, colorbar=False).axes) == 1


def test_grid_figure_places_each_map_at_its_row_and_column(picture):
    image, _ = picture
    maps = [[torch.full((32, 48), (i * 3 + j) / 6) for j in range(3)] for i in range(2)]
    figure = grid_figure(image, maps, rows=["m0", "m1"], columns=["a", "b", "c"], alpha=0.4)
    # the input, 2 method rows of 3 panels, and the colour bar
    assert len(figure.axes) == 1 + 2 * 3 + 1
    panels = figure.axes[1:7]
    for i in range(2):
        for j in range(3):
            shown = panels[i * 3 + j].get_images()[0].get_array()
            assert np.allclose(shown, overlay(image, maps[i][j], alpha=0.4))
    assert [axis.get_title() for axis in panels[:3]] == ["a", "b", "c"]
    assert [panels[i * 3].get_ylabel() for i in range(2)] == ["m0", "m1"]


def test_grid_figure_checks_the_labels_match_the_maps(picture):
    image, heat = picture
    with pytest.raises(InputError, match="2 rows x 1 columns"):
        grid_figure(image, [[heat, heat]], rows=["a", "b"], columns=["x"])


def test_explanation_grid_is_methods_by_classes_of_one_sample():
    model = tiny_vit(num_classes=5)
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[1, 3], [0, 4]])
    explainer = Explainer(model)
    explanations = {m: explainer.explain(images, target=targets, method=m) for m in ("generic",)}
    explanations["rollout"] = explainer.explain(images, target=targets, method="rollout")
    display = torch.rand(3, 32, 32)
    names = ["zero", "one", "two", "three", "four"]
    figure = explanation_grid(display, explanations, sample=1, class_names=names, colorbar=False)
    panels = figure.axes[1:]
    assert len(panels) == 2 * 2
    assert [axis.get_title() for axis in panels[:2]] == ["zero (0)", "four (4)"]
    assert [panels[0].get_ylabel(), panels[2].get_ylabel()] == ["generic", "rollout"]
    for row, method in enumerate(("generic", "rollout")):
        for column in range(2):
            expected = overlay(display, explanations[method].heatmap()[1, column])
            assert np.allclose(panels[row * 2 + column].get_images()[0].get_array(), expected)


def test_explanation_grid_transposed_puts_classes_in_rows_at_the_pictures_size():
    model = tiny_vit(num_classes=5)
    images = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    explainer = Explainer(model)
    targets = torch.tensor([[2, 4]])
    explanations = {m: explainer.explain(images, target=targets, method=m) for m in ("generic",)}
    display = torch.rand(3, 48, 40)  # drawn bigger than the model's input
    figure = explanation_grid(display, explanations, transpose=True, colorbar=False)
    panels = figure.axes[1:]
    assert [axis.get_ylabel() for axis in panels] == ["class 2", "class 4"]
    assert panels[0].get_title() == "generic"
    for row in range(2):
        expected = overlay(display, explanations["generic"].heatmap(size=(48, 40))[0, row])
        assert np.allclose(panels[row].get_images()[0].get_array(), expected)


def test_batch_figure_shows_each_image_with_its_own_map():
    model = tiny_vit(num_classes=5)
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    explainer = Explainer(model)
    explanations = {m: explainer.explain(images, method=m) for m in ("generic", "rollout")}
    pictures = torch.rand(3, 3, 32, 32)
    names = ["zero", "one", "two", "three", "four"]
    figure = batch_figure(pictures, explanations, class_names=names)
    assert len(figure.axes) == 3 * 3 + 1
    predicted = explanations["generic"].target.tolist()
    assert [axis.get_title() for axis in figure.axes[:3]] == [
        f"{names[c]} ({c})" for c in predicted
    ]
    for row, method in enumerate(("generic", "rollout"), start=1):
        assert figure.axes[row * 3].get_ylabel() == method
        for b in range(3):
            expected = overlay(pictures[b], explanations[method].heatmap()[b])
            assert np.allclose(figure.axes[row * 3 + b].get_images()[0].get_array(), expected)


def test_explanation_grid_refuses_to_compare_different_classes():
    model = tiny_vit(num_classes=5)
    images = torch.randn(1, 3, 32, 32)
    explainer = Explainer(model)
    explanations = {
        "a": explainer.explain(images, target=1),
        "b": explainer.explain(images, target=2),
    }
    with pytest.raises(InputError, match="same classes"):
        explanation_grid(torch.rand(3, 32, 32), explanations)


def test_text_figure_colours_each_token_by_its_signed_score():
    tokens = [["good", "<script>", "$5", "bad"], ["plain"]]
    scores = [torch.tensor([2.0, 0.0, 1.0, -2.0, 9.0]), [0.0]]  # 5th score: padding
    figure = text_figure(tokens, scores, labels=["positive", "neutral"], cmap="RdBu_r")
    texts = {t.get_text(): t for t in figure.axes[0].texts}
    assert set(texts) == {"good", "<script>", "$5", "bad", "plain", "positive", "neutral"}
    colormap = colormaps["RdBu_r"]

    def face(token):
        return np.asarray(texts[token].get_bbox_patch().get_facecolor())

    assert np.allclose(face("good"), colormap(1.0))  # the strongest evidence for
    assert np.allclose(face("bad"), colormap(0.0))  # the strongest evidence against
    assert np.allclose(face("$5"), colormap(0.75))  # half of the largest magnitude
    assert np.allclose(face("<script>"), colormap(0.5))
    assert texts["$5"].get_parse_math() is False


def test_text_figure_wraps_long_texts():
    words = ["word"] * 30  # 5 characters each with the space: 16 per 80-character line
    figure = text_figure([words], [[1.0] * 30], line_width=80)
    rows = sorted({round(t.get_position()[1], 6) for t in figure.axes[0].texts})
    assert len(rows) == 2


def test_text_figure_rejects_fewer_scores_than_tokens():
    with pytest.raises(InputError, match="2 tokens but 1 scores"):
        text_figure([["a", "b"]], [[1.0]])


def test_importing_viz_does_not_import_matplotlib():
    code = "import sys, explain.viz; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
