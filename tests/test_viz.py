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
from explain.viz.image import CLASS_AGNOSTIC
from explain.viz.scaling import scale_maps
from explain.viz.text_figure import LEGEND


@pytest.fixture
def picture():
    generator = torch.Generator().manual_seed(3)
    return torch.rand(3, 32, 48, generator=generator), torch.rand(32, 48, generator=generator)


def _close(shown, expected) -> bool:
    """Pictures and colours are float32: equal as float32 keeps (tests/tolerances.py)."""
    return np.allclose(shown, expected, rtol=1e-4)


def _grey(rgb: np.ndarray) -> np.ndarray:
    """The grey background, computed here from its definition: Rec. 601 luma mapped into
    the band [0.2, 0.7], the same in every channel."""
    luma = 0.299 * rgb[..., 0] + 0.587 * rgb[..., 1] + 0.114 * rgb[..., 2]
    return np.repeat((0.2 + 0.5 * luma)[..., None], 3, axis=-1)


def test_overlay_opacity_follows_the_relevance(picture):
    image, heat = picture
    rgb = image.permute(1, 2, 0).numpy()
    h = heat.numpy()[..., None]
    colored = colormaps["inferno"](heat.numpy())[..., :3]
    for background, under in (("grey", _grey(rgb)), ("colour", rgb)):
        shown = overlay(image, heat, cmap="inferno", alpha=0.0, background=background)
        assert _close(shown, under)
        blended = overlay(image, heat, cmap="inferno", alpha=0.3, background=background)
        assert blended.shape == (32, 48, 3)
        assert _close(blended, (1 - 0.3 * h) * under + 0.3 * h * colored)
        # where the relevance is 0 the background shows, whatever the colormap
        zero = overlay(image, torch.zeros(32, 48), cmap="jet", alpha=1.0, background=background)
        assert _close(zero, under)
    assert _close(overlay(image, heat), overlay(image, heat, cmap="inferno", alpha=0.8))


def test_grey_background_has_no_colour_and_neither_end_of_the_colormap():
    red = np.zeros((4, 4, 3))
    red[..., 0] = 1.0  # a pure red object, as in the shapes scenes
    white = np.ones((4, 4, 3))  # a pen stroke on the digits
    for image in (red, white, np.zeros((4, 4, 3))):
        shown = overlay(image, np.zeros((4, 4)))
        assert _close(shown[..., 0], shown[..., 1]) and _close(shown[..., 1], shown[..., 2])
        assert shown.min() >= 0.2 - 1e-9 and shown.max() <= 0.7 + 1e-9
    with pytest.raises(ExplainError, match="unknown background"):
        overlay(red, np.zeros((4, 4)), background="sepia")


def test_overlay_signed_uses_a_diverging_map_centred_at_zero(picture):
    image, heat = picture
    rgb = image.permute(1, 2, 0).numpy()
    rgb = _grey(rgb)
    signed = heat * 2 - 1
    h = signed.numpy()
    shown = overlay(image, signed, alpha=0.5, signed=True)
    colored = colormaps["RdBu_r"](0.5 + 0.5 * h)[..., :3]
    weight = 0.5 * np.abs(h)[..., None]
    assert _close(shown, (1 - weight) * rgb + weight * colored)
    negative = overlay(image, -torch.ones(32, 48), alpha=1.0, signed=True)
    assert _close(negative, colormaps["RdBu_r"](0.0)[:3])  # blue, not "low red"


def test_scale_maps_per_map_is_min_max_and_names_flat_maps():
    ramp = np.linspace(2.0, 4.0, 12).reshape(3, 4)
    scaled = scale_maps([ramp, np.zeros((3, 4)), np.full((3, 4), 7.0)])
    assert scaled.rule == "per_map" and not any(scaled.signed) and scaled.peaks == {}
    assert _close(scaled.maps[0], (ramp - 2.0) / 2.0)
    assert _close(scaled.maps[1], 0) and _close(scaled.maps[2], 0)
    assert scaled.notes == [None, "all-zero map", "constant map"]
    assert "own range" in scaled.caption() and scaled.keys() == [False]
    assert scaled.key_ticks(False)[1] == ["map min", "map max"]


def test_scale_maps_shared_keeps_the_maps_comparable():
    strong, weak = np.array([[0.0, 4.0]]), np.array([[0.0, 1.0]])
    scaled = scale_maps([strong, weak], "shared")
    assert scaled.peaks == {False: 4.0}
    assert _close(scaled.maps[1], [[0.0, 0.25]])  # a weak map looks weak
    assert scaled.key_ticks(False) == ([0.0, 1.0], ["0", "4"])
    with pytest.raises(InputError, match="unknown scale"):
        scale_maps([strong], "global")


def test_scale_maps_signed_maps_reach_full_colour_at_their_99th_percentile():
    # |R| is 0, 1, ..., 100: the 99th percentile is exactly 99, so the one extreme value
    # (100) is clipped instead of fading every other value.
    signed = np.arange(101.0)[None]
    signed[0, 1] = -1.0
    positive = np.array([[1.0, 3.0, 2.0]])
    scaled = scale_maps([signed, positive])
    assert scaled.signed == [True, False] and scaled.keys() == [False, True]
    expected = signed / 99.0
    expected[0, -1] = 1.0
    assert _close(scaled.maps[0], expected)
    assert _close(scaled.maps[1], [[0.0, 1.0, 0.5]])  # min-max: no baseline wash
    assert "signed maps (marked ±) by their 99th percentile of |relevance|" in scaled.caption()
    assert scaled.key_ticks(True)[1] == ["-p99|R|", "0", "+p99|R|"]
    assert scaled.key_label(True) == "signed maps, marked ±"
    # "shared": one scale per kind, never one red-blue scale for both kinds
    signed = np.array([[-2.0, 1.0]])
    shared = scale_maps([signed, positive, positive / 100], "shared")
    assert shared.signed == [True, False, False] and shared.keys() == [False, True]
    assert shared.peaks == {False: 3.0, True: 2.0}
    assert _close(shared.maps[0], [[-1.0, 0.5]])
    assert _close(shared.maps[1], [[1 / 3, 1.0, 2 / 3]])  # full colour on its own key
    assert _close(shared.maps[2], [[1 / 300, 1 / 100, 2 / 300]])  # weak among its kind
    assert shared.key_ticks(True)[1] == ["-2", "0", "2"]
    assert shared.key_ticks(False)[1] == ["0", "3"]
    assert shared.key_label(True) == "signed, marked ± (shared scale)"
    assert shared.key_label(False) == "unsigned (shared scale)"
    assert "unsigned maps 0 to 3, signed maps (marked ±) -2 to 2" in shared.caption()


def test_overlay_accepts_channels_last_and_grey_images(picture):
    image, heat = picture
    channels_last = overlay(image.permute(1, 2, 0).numpy(), heat)
    assert _close(channels_last, overlay(image, heat))
    grey = overlay(image[0].numpy(), heat, alpha=0.0, background="colour")
    assert _close(grey, np.repeat(image[0].numpy()[..., None], 3, axis=-1))
    greyed = overlay(image[0].numpy(), heat, alpha=0.0)  # luma of grey is the grey
    assert _close(greyed, 0.2 + 0.5 * np.repeat(image[0].numpy()[..., None], 3, axis=-1))


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


def _caption(figure) -> str:
    return " ".join(text.get_text() for text in figure.texts)


def test_grid_figure_opens_every_row_with_the_input_and_states_its_rule(picture):
    image, _ = picture
    ramp = torch.linspace(0, 1, 48).expand(32, 48)
    maps = [[ramp * (i * 3 + j) for j in range(3)] for i in range(2)]  # [0][0]: all zero
    figure = grid_figure(image, maps, rows=["m0", "m1"], columns=["a", "b", "c"], alpha=0.4)
    # 2 rows of (the input + 3 maps), and the colour key
    assert len(figure.axes) == 2 * 4 + 1
    panels = [figure.axes[i * 4 : (i + 1) * 4] for i in range(2)]
    rgb = image.permute(1, 2, 0).numpy()
    for i in range(2):
        assert _close(panels[i][0].get_images()[0].get_array(), rgb)
        assert panels[i][0].get_ylabel() == f"m{i}"
        for j in range(3):
            shown = panels[i][j + 1].get_images()[0].get_array()
            expected = _grey(rgb) if i == j == 0 else overlay(image, ramp, alpha=0.4)  # min-max
            assert _close(shown, expected)
    assert [axis.get_title() for axis in panels[0]] == ["input", "a", "b", "c"]
    assert [t.get_text() for t in panels[0][1].texts] == ["all-zero map"]
    assert "Each map min-max scaled to its own range (no common scale)" in _caption(figure)
    key = figure.axes[-1]
    assert [t.get_text() for t in key.get_yticklabels()] == ["map min", "map max"]


def test_grid_figure_shared_scale_has_a_value_bar(picture):
    image, _ = picture
    ramp = torch.linspace(0, 1, 48).expand(32, 48)
    figure = grid_figure(image, [[ramp * 2, ramp]], rows=["m"], columns=["a", "b"], scale="shared")
    weak = figure.axes[2].get_images()[0].get_array()
    assert _close(weak, overlay(image, ramp / 2))
    assert "One scale for every map (0 to 2" in _caption(figure)
    assert [t.get_text() for t in figure.axes[-1].get_yticklabels()] == ["0", "2"]


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
    panels = [figure.axes[i * 3 + 1 : (i + 1) * 3] for i in range(2)]  # after each input
    titles = [axis.get_title() for axis in panels[0]]
    ranks = _ranks(explanations["generic"].logits[1])
    assert titles == [f"zero (class 0), {ranks[0]}", f"four (class 4), {ranks[4]}"]
    # rollout reads no class: its row says so (the viewer heads it the same way)
    labels = [figure.axes[0].get_ylabel(), figure.axes[3].get_ylabel()]
    assert labels == ["generic", "rollout (class-agnostic)"]
    assert [e.class_agnostic for e in explanations.values()] == [False, True]
    caption = " ".join(" ".join(t.get_text() for t in figure.texts).split())
    assert f"{CLASS_AGNOSTIC[0].upper()}{CLASS_AGNOSTIC[1:]}." in caption  # the mark's meaning
    for row, method in enumerate(("generic", "rollout")):
        for column in range(2):
            expected = overlay(display, explanations[method].heatmap()[1, column])
            assert _close(panels[row][column].get_images()[0].get_array(), expected)


def test_explanation_grid_transposed_puts_classes_in_rows_at_the_pictures_size():
    model = tiny_vit(num_classes=5)
    images = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    explainer = Explainer(model)
    targets = torch.tensor([[2, 4]])
    explanations = {m: explainer.explain(images, target=targets, method=m) for m in ("generic",)}
    display = torch.rand(3, 48, 40)  # drawn bigger than the model's input
    figure = explanation_grid(display, explanations, transpose=True, colorbar=False)
    inputs, panels = figure.axes[0::2], figure.axes[1::2]
    ranks = _ranks(explanations["generic"].logits[0])
    assert [axis.get_ylabel() for axis in inputs] == [
        f"class 2, {ranks[2]}",
        f"class 4, {ranks[4]}",
    ]
    assert panels[0].get_title() == "generic"
    assert not any("lass-agnostic" in t.get_text() for t in figure.texts)  # nothing marked
    for row in range(2):
        expected = overlay(display, explanations["generic"].heatmap(size=(48, 40))[0, row])
        assert _close(panels[row].get_images()[0].get_array(), expected)


def test_batch_figure_shows_each_image_with_its_own_map():
    model = tiny_vit(num_classes=5)
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    explainer = Explainer(model)
    explanations = {m: explainer.explain(images, method=m) for m in ("generic", "rollout")}
    pictures = torch.rand(3, 3, 32, 32)
    names = ["0", "1", "2", "3", "4"]  # digits: a name that is its index is said once
    figure = batch_figure(pictures, explanations, class_names=names, labels=[4, 0, 1])
    assert len(figure.axes) == 3 * 3 + 1
    predicted = explanations["generic"].target.tolist()
    assert [axis.get_title() for axis in figure.axes[:3]] == [
        f"class {c}, predicted\nlabel: class {label}"
        for c, label in zip(predicted, [4, 0, 1], strict=True)
    ]
    with pytest.raises(InputError, match="3 pictures but 2 labels"):
        batch_figure(pictures, explanations, labels=[1, 2])
    caption = " ".join(" ".join(t.get_text() for t in figure.texts).split())
    assert f"{CLASS_AGNOSTIC[0].upper()}{CLASS_AGNOSTIC[1:]}." in caption  # rollout's mark
    for row, method in enumerate(("generic", "rollout (class-agnostic)"), start=1):
        assert figure.axes[row * 3].get_ylabel() == method
        method = method.split()[0]
        for b in range(3):
            expected = overlay(pictures[b], explanations[method].heatmap()[b])
            assert _close(figure.axes[row * 3 + b].get_images()[0].get_array(), expected)


def test_a_multi_label_models_titles_give_each_classs_presence_under_the_figures_title():
    # A rank undersells a multi-label model ("ranked 2nd" for a class present at 98.8%):
    # every image figure titles its classes by their probability of presence.
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    model = tiny_vit(num_classes=5)
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    explainer = Explainer(model)
    names = ["circle", "square", "ring", "star", "cross"]
    batch = {"generic": explainer.explain(images, method="generic")}
    present = torch.sigmoid(batch["generic"].logits)
    two = {"generic": explainer.explain(images, target=torch.tensor([[1, 3], [0, 4]]))}
    title = "zoo:shapes-vit: a ViT naming the shapes in a scene (multi-label)"
    pictures = torch.rand(2, 3, 32, 32)
    figures = {
        "batch": batch_figure(pictures, batch, class_names=names, multi_label=True, title=title),
        "grid": explanation_grid(
            pictures[1], two, sample=1, class_names=names, multi_label=True, title=title
        ),
    }
    predicted = batch["generic"].target.tolist()
    assert [axis.get_title() for axis in figures["batch"].axes[:2]] == [
        f"{names[c]} (class {c}), present {float(present[b, c]):.1%}"
        for b, c in enumerate(predicted)
    ]
    assert [axis.get_title() for axis in figures["grid"].axes[1:3]] == [
        f"{names[c]} (class {c}), present {float(present[1, c]):.1%}" for c in (0, 4)
    ]
    for figure in figures.values():
        renderer = FigureCanvasAgg(figure).get_renderer()
        figure.draw(renderer)
        (heading,) = [t for t in figure.texts if t.get_text() == title]
        box = heading.get_window_extent(renderer)
        assert box.x0 >= 0 and box.x1 <= figure.bbox.width and box.y1 <= figure.bbox.height
        for axis in figure.axes:  # above every panel and its title, touching none
            assert box.y0 > axis.get_window_extent(renderer).y1
            assert not box.overlaps(axis.title.get_window_extent(renderer))


def _ranks(logits: torch.Tensor) -> dict[int, str]:
    """Class -> its title suffix, from the sorted logits (no ties in random models)."""
    order = logits.argsort(descending=True).tolist()
    words = ["predicted", "ranked 2nd", "ranked 3rd", "ranked 4th", "ranked 5th"]
    return {c: words[order.index(c)] for c in order}


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
    labels = {"positive", "neutral", "(every relevance is 0)", LEGEND}  # "plain": nothing
    assert set(texts) == {"good", "<script>", "$5", "bad", "plain", *labels}
    colormap = colormaps["RdBu_r"]

    def face(token):
        return np.asarray(texts[token].get_bbox_patch().get_facecolor())

    assert _close(face("good"), colormap(1.0))  # the strongest evidence for
    assert _close(face("bad"), colormap(0.0))  # the strongest evidence against
    assert _close(face("$5"), colormap(0.75))  # half of the largest magnitude
    assert _close(face("<script>"), colormap(0.5))
    assert texts["$5"].get_parse_math() is False


def test_text_figure_wraps_long_texts():
    words = ["word"] * 30  # 5 characters each with the space: 16 per 80-character line
    figure = text_figure([words], [[1.0] * 30], line_width=80)
    words_drawn = [t for t in figure.axes[0].texts if t.get_text() == "word"]
    rows = sorted({round(t.get_position()[1], 6) for t in words_drawn})
    assert len(rows) == 2


def test_text_figure_rejects_fewer_scores_than_tokens():
    with pytest.raises(InputError, match="2 tokens but 1 scores"):
        text_figure([["a", "b"]], [[1.0]])


def test_importing_viz_does_not_import_matplotlib():
    code = "import sys, explain.viz; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_grid_with_signed_and_unsigned_maps_has_both_keys(picture):
    image, _ = picture
    ramp = torch.linspace(0, 1, 48).expand(32, 48)
    signed = ramp * 2 - 0.5  # -0.5 .. 1.5: evidence against on the left
    figure = grid_figure(image, [[ramp, signed]], rows=["m"], columns=["a", "b"])
    shown = figure.axes[2].get_images()[0].get_array()
    top = np.percentile(np.abs(signed.numpy()), 99)
    expected = overlay(image, np.clip(signed.numpy() / top, -1, 1), signed=True)
    assert _close(shown, expected)
    # the signed panel, and only it, is marked as reading the diverging key
    assert [t.get_text() for t in figure.axes[2].texts] == ["±"] and not figure.axes[1].texts
    keys = figure.axes[3:]
    assert [" ".join(axis.get_ylabel().split()) for axis in keys] == [
        "unsigned maps",
        "signed maps, marked ±",
    ]
    assert "for signed maps (marked ±) by their 99th percentile" in _caption(figure)
    # the two keys' labels, wrapped to their bars, neither overlap nor leave their bars
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(figure).get_renderer()
    labels = [axis.yaxis.label.get_window_extent(renderer) for axis in keys]
    bars = [axis.get_window_extent(renderer) for axis in keys]
    assert not labels[0].overlaps(labels[1])
    edge = figure.bbox.x1
    for label, bar in zip(labels, bars, strict=True):
        assert bar.y0 - 1 <= label.y0 and label.y1 <= bar.y1 + 1 and label.x1 <= edge


def test_a_shared_grid_of_signed_and_unsigned_maps_keeps_one_scale_per_kind(picture):
    """generic-like maps (non-negative, peak 0.03) beside AttnLRP-like ones (signed, peak
    2): on one red-blue scale the unsigned maps would be drawn almost white. Each kind is
    drawn on its own shared scale, with its own key in relevance units."""
    image, _ = picture
    ramp = torch.linspace(0, 1, 48).expand(32, 48)
    unsigned = [ramp * 0.03, ramp * 0.015]
    signed = [(ramp * 2 - 0.5) * 4 / 3, ramp - 0.5]  # -2/3 .. 2 and -0.5 .. 0.5
    figure = grid_figure(
        image, [unsigned, signed], rows=["generic", "attnlrp"], columns=["a", "b"],
        scale="shared",
    )  # fmt: skip
    panels = [figure.axes[1:3], figure.axes[4:6]]
    for axis, heat in zip(panels[0], unsigned, strict=True):  # 0 .. 0.03 on inferno
        shown = axis.get_images()[0].get_array()
        assert _close(shown, overlay(image, heat / 0.03)) and not axis.texts
    for axis, heat in zip(panels[1], signed, strict=True):  # -2 .. 2, diverging, marked
        shown = axis.get_images()[0].get_array()
        assert _close(shown, overlay(image, heat / 2.0, signed=True))
        assert [t.get_text() for t in axis.texts] == ["±"]
    keys = figure.axes[6:]
    assert [" ".join(axis.get_ylabel().split()) for axis in keys] == [
        "unsigned (shared scale)",
        "signed, marked ± (shared scale)",
    ]
    assert [[t.get_text() for t in axis.get_yticklabels()] for axis in keys] == [
        ["0", "0.03"],
        ["-2", "0", "2"],
    ]
    assert "One shared scale per kind of map: unsigned maps 0 to 0.03, signed maps" in (
        _caption(figure)
    )


def test_grid_figure_wraps_many_columns_into_blocks_that_open_with_the_input(picture):
    image, _ = picture
    ramp = torch.linspace(0, 1, 48).expand(32, 48)
    columns = [f"m{j}" for j in range(6)]
    maps = [[ramp * (j + 1) for j in range(6)] for _ in range(2)]
    figure = grid_figure(image, maps, rows=["a", "b"], columns=columns, maps_per_row=4)
    # blocks of 4 and 2 maps, each with both rows, each row opening with the input; the key
    panels = figure.axes[:-1]
    assert len(panels) == 2 * (1 + 4) + 2 * (1 + 2)
    second_block = panels[10:]
    assert [axis.get_title() for axis in second_block[:3]] == ["input", "m4", "m5"]
    assert [second_block[0].get_ylabel(), second_block[3].get_ylabel()] == ["a", "b"]
    assert figure.get_size_inches()[0] < 14  # about 2000 px wide at 150 dpi, not 7 panels
    with pytest.raises(InputError, match="maps_per_row"):
        grid_figure(image, maps, rows=["a", "b"], columns=columns, maps_per_row=0)


def test_figure_captions_wrap_to_the_figure_width(picture):
    figure = heatmap_figure(*picture)
    caption = figure.texts[-1].get_text()
    lines = caption.split("\n")
    assert len(lines) > 1 and "every colour is relevance" in " ".join(lines)
    width = figure.get_size_inches()[0]
    assert all(len(line) * 0.056 <= width for line in lines)


def test_a_long_title_wraps_within_the_panel(picture):
    title = "transformer_attribution: tabby (class 281), ranked 2nd"
    figure = heatmap_figure(*picture, title=title)
    lines = figure.axes[0].get_title().split("\n")
    assert len(lines) == 2 and " ".join(lines) == title
    assert all(len(line) * 0.072 <= 2.4 for line in lines)  # the panel's 2.4 inches


MATH = r"a $\x$ b"  # mathtext cannot parse \x: drawn as math, the figure would not render


def test_dollar_signs_in_user_text_are_drawn_as_written(picture, tmp_path):
    from explain.viz.multimodal import clip_figure

    image, heat = picture
    figures = [
        grid_figure(image, [[heat]], rows=[MATH], columns=[MATH]),
        heatmap_figure(image, heat, title=MATH),
        text_figure([[MATH, "$", "b"]], [[0.5, -1.0, 0.2]], labels=[MATH]),
        clip_figure(image, [heat], [[MATH, "$"]], [[1.0, 0.5]], labels=[MATH]),
    ]
    for index, figure in enumerate(figures):
        save_figure(figure, tmp_path / f"figure{index}.png")  # rendering parses any math
        texts = [t.get_text() for t in figure.findobj(lambda a: hasattr(a, "get_text"))]
        assert any(MATH in text for text in texts)
    import matplotlib

    assert matplotlib.rcParams["text.parse_math"]  # the user's own setting is left alone
