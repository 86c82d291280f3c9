"""The vision-language answer's figure and page draw the same thing: one kind of scale
per method (signed or not, decided on the patch-grid maps before upsampling), each
word's overlay on the page the figure's panel pixel for pixel, and one colour key."""

from __future__ import annotations

import base64
import io
import json
import re

import numpy as np
import torch
from PIL import Image

from explain.viz.image_answer import answer_figure, answer_html, answer_scale
from explain.viz.scaling import maps_are_signed
from explain.viz.text import contrast_ratio

PHOTO = (np.random.default_rng(0).random((12, 16, 3)) * 255).astype(np.uint8)


def _maps():
    """Word 0's map is signed; word 1's, of the same method, happens to be all positive."""
    rows, cols = torch.meshgrid(torch.arange(12.0), torch.arange(16.0), indexing="ij")
    return torch.stack([rows - 4.0, cols + 1.0]).double()


def _page(maps, signed):
    return answer_html(
        PHOTO,
        maps,
        ["q", "[image]"],
        torch.tensor([[0.3, -0.1], [0.2, 0.4]]),
        ["red", "circle"],
        None,
        rests_on=[[0], [1]],
        signed=signed,
    )


def _words(page: str) -> list[dict]:
    return json.loads(re.search(r'id="answer">(.*?)</script>', page).group(1))


def _overlays(page: str) -> list[np.ndarray]:
    words = _words(page)
    return [
        np.asarray(Image.open(io.BytesIO(base64.b64decode(w["overlay"].split(",", 1)[1]))))
        for w in words
    ]


def test_one_method_one_kind_of_scale():
    maps = _maps()
    assert maps_are_signed(maps) and not maps_are_signed(maps[1])
    assert answer_scale(maps).signed == [True, False]  # decided per map: mixed kinds
    assert answer_scale(maps, signed=True).signed == [True, True]
    figure = answer_figure(PHOTO, maps, ["red", "circle"], signed=True)
    keys = [axis for axis in figure.axes if not axis.images]
    assert len(keys) == 1 and keys[0].get_ylim() == (-1.0, 1.0)  # one diverging key
    assert keys[0].get_ylabel() == "signed maps"
    assert not any(text.get_text() == "±" for axis in figure.axes for text in axis.texts)


def test_the_page_draws_what_the_png_draws():
    maps = _maps()
    for signed in (True, False):
        figure = answer_figure(PHOTO, maps, ["red", "circle"], signed=signed)
        panels = [axis for axis in figure.axes if axis.images][1:3]  # after the photo
        drawn = [np.asarray(axis.images[0].get_array()) for axis in panels]
        shown = _overlays(_page(maps, signed))
        for panel, overlay in zip(drawn, shown, strict=True):
            expected = (np.clip(panel, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
            np.testing.assert_array_equal(overlay, expected)
    page = _page(maps, True)
    assert 'id="key"' in page and "-p99|R|" in page and "red for, blue against" in page
    unsigned = _page(maps, False)
    assert "map min" in unsigned and "min-max" in unsigned


def test_every_token_is_written_in_the_ink_its_shade_needs():
    # The readout token (index 2) is drawn at full colour though its value (0.1) is small
    # beside the others' scale: its ink must follow the shade drawn, not the value.
    page = answer_html(
        PHOTO,
        _maps(),
        ["q", "[image]", "assistant"],
        torch.tensor([[0.5, -0.2, 0.1], [0.05, -0.9, 2.0]]),
        ["red", "circle"],
        2,
        rests_on=[[0, 1], [1, 0]],
    )
    for word in _words(page):
        for shade, light in zip(word["colours"], word["light"], strict=True):
            background = tuple(int(c) for c in re.findall(r"\d+", shade))
            ink = (255, 255, 255) if light else (0, 0, 0)
            assert contrast_ratio(ink, background) >= 4.5, (word["word"], shade, light)
