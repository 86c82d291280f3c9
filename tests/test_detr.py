"""DETR: each detection's relevance against an independent float64 computation.

The reference takes the attention maps from transformers' own `output_attentions` path,
their gradients from autograd (one `autograd.grad` per detection), and applies the
encoder-decoder rules one sample at a time (tests/reference_coattention.py). Nothing in
it uses explain.
"""

from __future__ import annotations

import pytest
import torch
from reference_coattention import encoder_decoder, gradient_weighted

from explain import Explainer, OptionError, TargetError
from explain.detections import maps_on_images
from explain.testing import ModelState, tiny_detr

IMAGES = torch.randn(2, 3, 96, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


@pytest.fixture(scope="module")
def detr():
    return tiny_detr().double()


def _reference(model, images, queries: torch.Tensor, conditional: bool):
    """(B, K, N_image) image relevance and (B, K) labels of the detections at `queries`:
    each query's most probable class (DETR's last logit is "no object")."""
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = "eager"
    try:
        output = model(pixel_values=images, output_attentions=True)
    finally:
        config._attn_implementation = previous
    maps = [*output.encoder_attentions, *output.decoder_attentions, *output.cross_attentions]
    classes = output.logits if conditional else output.logits[..., :-1]
    labels = classes.argmax(dim=-1).gather(1, queries)
    encoder, decoder = len(output.encoder_attentions), len(output.decoder_attentions)
    relevance = torch.zeros(*queries.shape, maps[0].shape[-1], dtype=torch.float64)
    for k in range(queries.shape[1]):
        rows = torch.arange(images.shape[0])
        score = output.logits[rows, queries[:, k], labels[:, k]].sum()
        grads = torch.autograd.grad(score, maps, retain_graph=True)
        for b in range(images.shape[0]):
            bar = [gradient_weighted(a[b], g[b]) for a, g in zip(maps, grads, strict=True)]
            _, r_qi, _ = encoder_decoder(
                bar[:encoder], bar[encoder : encoder + decoder], bar[encoder + decoder :]
            )
            relevance[b, k] = r_qi[queries[b, k]]
    return relevance, labels


@pytest.mark.parametrize("conditional", [False, True], ids=["detr", "conditional_detr"])
def test_each_detection_equals_the_float64_reference(conditional):
    model = tiny_detr(conditional=conditional).double()
    queries = torch.tensor([[0, 3, 5], [2, 1, 4]])
    result = Explainer(model).explain(IMAGES, queries=queries)
    expected, labels = _reference(model, IMAGES, queries, conditional)
    assert result.relevance.shape == (2, 3, 3, 2)  # 96 x 64 pixels, stride 32: 3 x 2 tokens
    torch.testing.assert_close(result.relevance.flatten(2), expected, rtol=1e-9, atol=1e-12)
    assert torch.equal(result.target, labels)
    assert torch.equal(result.detections.queries, queries)
    assert result.relevances["queries"].shape == (2, 3, 6)


def test_detections_above_the_threshold_are_explained_best_first_the_rest_padded(detr):
    explainer = Explainer(detr)
    with torch.no_grad():
        probabilities = detr(pixel_values=IMAGES).logits.softmax(-1)[..., :-1]
    best = probabilities.amax(dim=-1)
    lowest = best[0].sort().values  # the threshold leaves out image 0's least sure query
    threshold = float(lowest[0] + lowest[1]) / 2
    result = explainer.explain(IMAGES, threshold=threshold)
    found = result.detections
    counts = (best > threshold).sum(dim=1)
    assert found.valid.sum(dim=1).tolist() == counts.tolist()
    assert result.relevance.shape[1] == int(counts.max())
    for b in range(2):
        valid = found.valid[b]
        assert (found.scores[b, valid][:-1] >= found.scores[b, valid][1:]).all()  # best first
        assert (result.target[b, ~valid] == -1).all()
        assert (result.relevance[b, ~valid] == 0).all()
    # a padded column's image is explained exactly as with its queries named
    named = explainer.explain(IMAGES[:1], queries=found.queries[:1, : int(counts[0])])
    torch.testing.assert_close(result.relevance[:1, : int(counts[0])], named.relevance)


def test_maps_go_back_onto_each_original_image_and_boxes_into_its_pixels(detr):
    mask = torch.ones(2, 96, 64, dtype=torch.long)
    mask[1, 64:, :] = 0  # image 1 was 64 x 64, padded at the bottom by the processor
    result = Explainer(detr).explain({"pixel_values": IMAGES, "pixel_mask": mask}, queries=0)
    found = result.detections
    assert found.image_sizes.tolist() == [[96, 64], [64, 64]]
    maps = maps_on_images(result.relevance, found, result.input_size, sizes=[(192, 128), (32, 32)])
    assert [tuple(m.shape) for m in maps] == [(1, 192, 128), (1, 32, 32)]
    assert all(float(m.min()) == 0.0 and float(m.max()) == 1.0 for m in maps)
    corners = found.corners([(192, 128), (32, 32)])
    cx, cy, w, h = found.boxes[1, 0].tolist()
    expected = [(cx - w / 2) * 32, (cy - h / 2) * 32, (cx + w / 2) * 32, (cy + h / 2) * 32]
    torch.testing.assert_close(corners[1, 0], torch.tensor(expected, dtype=torch.float64))


def test_no_side_effects_and_clear_refusals(detr):
    explainer = Explainer(detr)
    before = ModelState.capture(detr)
    explainer.explain(IMAGES, queries=[1, 2])
    with pytest.raises(TargetError, match=r"no detection scores above threshold 0\.99"):
        explainer.explain(IMAGES, threshold=0.99)
    with pytest.raises(OptionError, match="no target"):
        explainer.explain(IMAGES, target=1)
    with pytest.raises(OptionError, match="class logit"):
        explainer.explain(IMAGES, score="probability")
    with pytest.raises(OptionError, match=r"queries must be in 0\.\.5"):
        explainer.explain(IMAGES, queries=6)
    with pytest.raises(OptionError, match="not available"):
        explainer.explain(IMAGES, method="rollout")
    # Issue 37: 1.5 was explained as query 1, "0.5" accepted, None a raw TypeError.
    for queries in (1.5, [1.0, 2.0], torch.tensor([[0.5], [1.5]]), [True, False], "1"):
        with pytest.raises(OptionError, match=r"queries must be .* query indices"):
            explainer.explain(IMAGES, queries=queries)
    for threshold in ("0.5", None, True, [0.5]):
        with pytest.raises(OptionError, match="threshold must be a number in"):
            explainer.explain(IMAGES, threshold=threshold)
    with pytest.raises(OptionError, match=r"threshold must be in \[0, 1\), got nan"):
        explainer.explain(IMAGES, threshold=float("nan"))
    assert before.differences(ModelState.capture(detr)) == []


@pytest.fixture(scope="module")
def detr_folder(tmp_path_factory):
    """A tiny DETR saved with its image processor, as `explain detect --model` reads it."""
    from transformers import DetrImageProcessor

    folder = tmp_path_factory.mktemp("detr")
    tiny_detr().save_pretrained(folder)
    DetrImageProcessor(size={"shortest_edge": 64, "longest_edge": 96}).save_pretrained(folder)
    return folder


def _save_photo(path, seed=0):
    import numpy as np
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = (np.random.default_rng(seed).random((70, 90, 3)) * 255).astype("uint8")
    Image.fromarray(pixels).save(path)
    return path


def test_explain_detect_writes_one_figure_per_image_with_its_detections(
    detr_folder, tmp_path, capsys, monkeypatch
):
    import explain.viz
    from explain.cli import main

    drawn = []
    save = explain.viz.save_figure
    monkeypatch.setattr(
        explain.viz, "save_figure", lambda figure, path: drawn.append(figure) or save(figure, path)
    )
    photo = _save_photo(tmp_path / "photo.png")
    out = tmp_path / "out"
    assert main(["detect", str(photo), "--model", str(detr_folder), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 7 and all("LABEL_0" in line and "box" in line for line in lines[:6])
    # named as `explain image --grid` names its figures, and said so
    assert lines[6] == str(out / "photo_grid.png") and (out / "photo_grid.png").is_file()
    (figure,) = drawn
    # a title (model, image, method), a colour key and the rule (caption) below
    texts = [text.get_text() for text in figure.texts]
    assert f"explain detect: {detr_folder}: photo.png (generic;" in texts[-1]
    assert "min-max scaled to its own range" in texts[0] and "box" in texts[0]
    panels, keys = figure.axes[:6], figure.axes[6:]
    assert [key.get_ylabel() for key in keys] == ["each map's own range"]
    assert [panel.get_title() for panel in panels] == ["LABEL_0 0.84"] * 6
    assert all(len(panel.patches) == 1 for panel in panels)  # each detection's box
    # six detections in rows of four, not a strip of six small panels
    rows = sorted({round(panel.get_position().y0, 3) for panel in panels}, reverse=True)
    assert len(rows) == 2
    assert [round(p.get_position().y0, 3) for p in panels] == [rows[0]] * 4 + [rows[1]] * 2
    assert panels[0].get_position().width * figure.get_size_inches()[0] >= 2.0  # inches
    assert main(["detect", str(photo), "--model", "zoo:shapes-vit"]) == 2
    assert "explains object detectors" in capsys.readouterr().err


def test_explain_detect_never_overwrites_an_output_of_images_with_the_same_name(
    detr_folder, tmp_path, capsys
):
    from explain.cli import main

    inputs = [tmp_path / "a" / "photo.png", tmp_path / "b" / "photo.png", tmp_path / "photo.jpg"]
    for seed, path in enumerate(inputs):
        _save_photo(path, seed)
    out = tmp_path / "out"
    assert main(["detect", *map(str, inputs), "--model", str(detr_folder), "--out", str(out)]) == 0
    written = [line for line in capsys.readouterr().out.splitlines() if line.endswith(".png")]
    names = ["photo_grid.png", "photo-2_grid.png", "photo-3_grid.png"]
    assert written == [str(out / name) for name in names]
    assert sorted(path.name for path in out.iterdir()) == sorted(names)


def test_a_hub_id_loads_with_its_image_processor(tmp_path, monkeypatch):
    import huggingface_hub
    from transformers import DetrImageProcessor

    from explain.loading.specs import load_model
    from explain.testing import cache_hub_repo

    folder = tmp_path / "saved"
    tiny_detr().save_pretrained(folder)
    DetrImageProcessor(size={"shortest_edge": 64, "longest_edge": 96}).save_pretrained(folder)
    cache_hub_repo(tmp_path / "hub", "facebook/detr-resnet-50", folder)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = load_model("facebook/detr-resnet-50")
    assert isinstance(loaded.image_processor, DetrImageProcessor)
    assert loaded.preprocessing is None and loaded.modality == "image"
    assert Explainer(loaded.model).explain(IMAGES.float(), queries=1).relevance.shape == (
        2,
        1,
        3,
        2,
    )
