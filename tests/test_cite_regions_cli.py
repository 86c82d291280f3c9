"""`explain cite --image` on a tiny LLaVA saved with its processor (offline): the three
files say what the Python API says, each method's own files with several methods, the
page embeds the figure's picture pixel for pixel, regions from a JSON file, and clear
errors."""

from __future__ import annotations

import base64
import io
import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

from explain import Explainer
from explain.cite.image import RegionCitation, cite_image
from explain.cite.regions import grid_regions
from explain.cite.regions_page import region_picture, regions_figure, regions_html
from explain.cli import main
from explain.testing.tiny_vlm import save_tiny_llava, tiny_llava, tiny_llava_processor

QUESTION = "w12 w13"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_llava(tmp_path_factory.mktemp("tiny-llava"))


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    pixels = (np.random.default_rng(7).random((40, 60, 3)) * 255).astype(np.uint8)
    path = tmp_path_factory.mktemp("photo") / "photo.png"
    Image.fromarray(pixels).save(path)
    return path, pixels


def _cite(folder, photo, out, *options):
    arguments = ["cite", "--model", str(folder), "--image", str(photo[0]), "--question"]
    arguments += [QUESTION, "--answer", "w14 w15", "--out", str(out), *options]
    return main(arguments)


def test_the_three_files_say_what_the_python_api_says(folder, photo, tmp_path, capsys):
    assert _cite(folder, photo, tmp_path, "--grid", "2x3", "--lds", "4") == 0
    printed = capsys.readouterr().out
    assert "verdict: " in printed and "random regions" in printed
    explainer = Explainer(tiny_llava(), tokenizer=tiny_llava_processor())
    expected = cite_image(explainer, photo[1], QUESTION, "w14 w15", grid=(2, 3), lds=4)
    document = json.loads((tmp_path / "cite.json").read_text())
    assert [r["name"] for r in document["regions"]] == [r.name for r in expected.regions]
    assert [r["box"] for r in document["regions"]] == [list(r.box) for r in expected.regions]
    scores = torch.tensor([r["score"] for r in document["regions"]], dtype=torch.float64)
    torch.testing.assert_close(scores, expected.scores, rtol=1e-5, atol=1e-7)
    loaded = RegionCitation.load(tmp_path / "cite.json")
    assert loaded.check.drops[0].top == pytest.approx(expected.check.drops[0].top, abs=1e-5)
    assert document["check"]["verdict"] == expected.check.verdict.word
    assert (tmp_path / "cite.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "cite.html").read_text()
    assert "random sets of k regions" in page and expected.check.verdict.word in page
    assert not re.search(r"(href)\s*=|https?:|@import|url\(", page)


def test_regions_from_a_json_file(folder, photo, tmp_path):
    regions = tmp_path / "regions.json"
    regions.write_text(json.dumps([
        {"name": "left <b>", "box": [0, 0, 30, 40]}, {"name": "right", "box": [30, 0, 60, 40]}
    ]))  # fmt: skip
    assert _cite(folder, photo, tmp_path, "--regions", str(regions)) == 0
    document = json.loads((tmp_path / "cite.json").read_text())
    assert [r["name"] for r in document["regions"]] == ["left <b>", "right"]
    assert "left &lt;b&gt;" in (tmp_path / "cite.html").read_text()


def test_superpixel_regions(folder, photo, tmp_path, capsys):
    from explain.cite.regions import slic_regions

    # two flat halves: SLIC follows their edge (the noise photo has none to follow)
    halves = np.zeros((40, 60, 3), dtype=np.uint8)
    halves[:, 30:] = (200, 40, 40)
    path = tmp_path / "halves.png"
    Image.fromarray(halves).save(path)
    assert _cite(folder, (path, halves), tmp_path, "--regions", "slic:6") == 0
    document = json.loads((tmp_path / "cite.json").read_text())
    expected = slic_regions(halves, 6)
    assert len(expected) >= 2
    assert [r["name"] for r in document["regions"]] == [r.name for r in expected]
    assert [r["box"] for r in document["regions"]] == [list(r.box) for r in expected]
    assert _cite(folder, photo, tmp_path, "--regions", "slic:six") == 2
    assert "superpixels are slic:N" in capsys.readouterr().err
    assert _cite(folder, photo, tmp_path, "--regions", "slic:6") == 2
    assert "SLIC found one superpixel" in capsys.readouterr().err


def test_several_methods_each_write_their_own_files(folder, photo, tmp_path, capsys):
    assert _cite(folder, photo, tmp_path, "--method", "generic,attnlrp", "--grid", "2x2") == 0
    printed = capsys.readouterr().out
    assert printed.index("[generic]") < printed.index("[attnlrp]")
    assert not (tmp_path / "cite.json").exists()
    explainer = Explainer(tiny_llava(), tokenizer=tiny_llava_processor())
    for method in ("generic", "attnlrp"):
        saved = RegionCitation.load(tmp_path / f"cite_{method}.json")
        expected = cite_image(explainer, photo[1], QUESTION, "w14 w15", grid=(2, 2), method=method)
        assert saved.method == method
        torch.testing.assert_close(saved.scores, expected.scores, rtol=1e-5, atol=1e-7)
        assert (tmp_path / f"cite_{method}.png").is_file()
        assert f"({method})" in (tmp_path / f"cite_{method}.html").read_text()
    scores = [
        RegionCitation.load(tmp_path / f"cite_{m}.json").scores for m in ("generic", "attnlrp")
    ]
    assert not torch.allclose(*scores)  # each file holds its own method's scores


def test_errors_are_one_line(folder, photo, tmp_path, capsys):
    assert _cite(folder, photo, tmp_path, "--grid", "3by3") == 2
    assert "a grid is ROWSxCOLS" in capsys.readouterr().err
    assert _cite(folder, photo, tmp_path, "--foil", "w9") == 2
    assert "--image takes no --foil" in capsys.readouterr().err
    bad = ["cite", "--model", str(folder), "--question", "w12", "--out", str(tmp_path)]
    assert main(bad) == 2
    assert "--context FILE" in capsys.readouterr().err


def _data_png(address: str) -> np.ndarray:
    encoded = address.split(",", 1)[1]
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(encoded))).convert("RGB"))


def test_the_page_shows_the_figures_picture_on_one_signed_scale():
    pixels = np.full((30, 30, 3), 200, dtype=np.uint8)
    cells = grid_regions((30, 30), 2, 2)
    scores = [0.5, -0.25, 0.0, 0.1]
    picture = region_picture(pixels, cells, scores)
    # the top region full red-tinted, the negative one blue, the zero one untouched inside
    inside = picture[7, 7], picture[7, 22], picture[22, 7]
    assert inside[0][0] > inside[0][2] and inside[1][2] > inside[1][0]
    np.testing.assert_allclose(inside[2], 200 / 255)
    assert (picture[:15, 14] == 0.15).all() and (picture[14, :15] == 0.15).all()  # outlines
    figure = regions_figure(pixels, cells, scores, caption="check")
    drawn = figure.axes[0].images[0].get_array()
    np.testing.assert_allclose(np.asarray(drawn), picture)
    key = figure.axes[-1]
    assert key.get_ylim() == pytest.approx((-0.5, 0.5))  # one signed key: -max|s| .. max|s|
    page = regions_html(pixels, cells, scores, "q", "a")
    shown = _data_png(re.search(r'id="regions" src="([^"]+)"', page).group(1))
    np.testing.assert_array_equal(shown, (np.clip(picture, 0, 1) * 255 + 0.5).astype(np.uint8))
    ranked = re.findall(r"<li>.*?</li>", page)
    assert [re.search(r"r\dc\d", item).group(0) for item in ranked] == [
        "r1c1",
        "r2c2",
        "r2c1",
        "r1c2",
    ]


def test_each_outline_contrasts_with_the_photo_around_it():
    # The shapes scenes are dark: a dark outline vanished there, and a red object tinted
    # red for a high score showed no region at all.
    from explain.cite.regions import Region
    from explain.viz.text import contrast_ratio

    mask = np.zeros((20, 20), dtype=bool)
    mask[5:15, 5:15] = True
    for grey in (30, 220):  # a dark and a light photo
        photo = np.full((20, 20, 3), grey, dtype=np.uint8)
        picture = region_picture(photo, [Region("square", mask, (5, 5, 15, 15))], [1.0])
        edge = tuple(round(float(c) * 255) for c in picture[5, 10])
        assert (picture[5, 5:15] == picture[5, 10]).all()  # the whole top edge
        assert contrast_ratio(edge, (grey,) * 3) >= 4.5, (grey, edge)


def test_a_cropped_photo_is_said_in_the_figures_and_terminals_of_both_image_commands(
    folder, photo, tmp_path, capsys, monkeypatch
):
    """The tiny LLaVA's processor keeps the 60x40 photo's shorter side and crops the
    centre: the figures and the terminals of `explain cite --image` and `explain generate
    --image` say what the model saw, in the words of the terminal of `explain image`
    (crop_note), once per command."""
    import explain.viz
    from explain.loading import load_model

    note = load_model(str(folder)).preprocessing.crop_note((40, 60))
    assert note == "centre-cropped 60x40 -> 40x40 (67% of the image)"
    captions = []

    def keep_caption(figure, out):  # its texts without white space: lines wrap at hyphens
        captions.append("".join("".join(t.get_text() for t in figure.texts).split()))

    monkeypatch.setattr(explain.viz, "save_figure", keep_caption)
    sentence = f"The model saw only part of the photo: {note}."
    capsys.readouterr()
    assert _cite(folder, photo, tmp_path / "cited") == 0
    assert capsys.readouterr().out.splitlines().count(sentence) == 1
    generate = ["generate", "--image", str(photo[0]), QUESTION, "--model", str(folder)]
    assert main([*generate, "--max-new-tokens", "2", "--out", str(tmp_path / "answer")]) == 0
    assert capsys.readouterr().out.splitlines().count(sentence) == 1
    said = "".join(sentence.split())
    assert len(captions) == 2 and all(said in text for text in captions)
