"""A vision-language model's answer about a photo, as one static HTML page and one figure.

The page: the photo, the question's tokens beside it and the answer's words below.
Clicking a word of the answer shows its relevance map over the photo (drawn as an
overlay, embedded as a PNG data address) and colours the question's tokens by their
relevance for that word. It is self-contained (nothing fetched): tokens are escaped HTML,
and each word's overlay and token colours are embedded as JSON that a few lines of
inline script apply. Token colours are the diverging scale of explain.viz.text (red for,
blue against), scaled per word by the largest magnitude among the question's tokens
without the token the prediction is read out at (the identity term of the rules would
swamp every other token; it is framed instead). A run of image tokens is shown as one
"[image]" token carrying the sum of the image's map. The status line names the tokens
the chosen word rests on most, by |relevance|, with positions and signed values, the
readout token left out (explain.viz.ranking, as the terminal says). The page opens on
the first word, or on word g (counted from 1) of the address `page.html#g`; a click or
Enter on a word shows it and updates the address.

The figure: under a title (the model, the method, the question), the photo, then one
panel per word with its map over the photo, in reading order, wrapping after
`MAPS_PER_ROW` words; a colour key and the scaling rule.

Both draw each word's map from one `answer_scale` (explain.viz.scaling): one kind of
scale for the method's maps, signed or not as the caller decided on the maps before
they were upsampled (`maps_are_signed`), so the page's overlay of a word is the figure's
panel, pixel for pixel, and the page states the same rule under the same key.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

from explain.errors import InputError
from explain.viz.choice_script import choice_script
from explain.viz.image import (
    MAPS_PER_ROW,
    _colormap,
    _reading_order_panels,
    figure_caption,
    overlay,
)
from explain.viz.literal import literal_text
from explain.viz.ranking import sources_text
from explain.viz.scaling import DIVERGING, SEQUENTIAL, FigureScale, scale_maps
from explain.viz.text import colour, text_colour

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["answer_figure", "answer_html", "answer_scale"]

_SCRIPT = """
const words = JSON.parse(document.getElementById("answer").textContent);
function choose(g) {
  const word = words[g];
  document.getElementById("map").src = word.overlay;
  document.getElementById("map").alt = "relevance of '" + word.word + "' over the photo";
  document.querySelectorAll("span.tok").forEach((span, t) => {
    span.style.backgroundColor = word.colours[t];
    span.style.color = word.light[t] ? "white" : "";
    span.title = word.values[t];
    span.classList.toggle("readout", t === word.readout);
  });
  document.querySelectorAll("span.word").forEach(span =>
    span.classList.toggle("chosen", Number(span.dataset.g) === g));
  document.getElementById("status").textContent =
    "relevance for the answer's word " + (g + 1) + " of " + words.length + ": " + word.word +
    " rests most on " + word.rests;
}
"""

_CHOICE = choice_script("span.word", "words")

_STYLE = """
body { font-family: sans-serif; max-width: 70em; margin: 2em auto; }
div.pair { display: flex; gap: 2em; align-items: flex-start; }
img#map { max-width: 28em; width: 100%; image-rendering: auto; border: 1px solid #ccc; }
div.tokens { line-height: 2.2; flex: 1; }
span.tok { padding: 2px 3px; border-radius: 3px; white-space: pre-wrap; }
span.readout { outline: 2px solid #555; }
p.answer { line-height: 2.4; font-size: 1.1em; }
span.word { cursor: pointer; padding: 2px 4px; text-decoration: underline dotted; }
span.word:focus-visible { outline: 3px solid #1a5fb4; outline-offset: 1px; }
span.chosen { outline: 2px solid black; border-radius: 3px; }
p.legend { color: #555; line-height: 1.4; }
div.key { display: flex; align-items: center; gap: 0.5em; color: #555; font-size: 0.9em; }
img#key { height: 1em; width: 12em; border: 1px solid #ccc; }
"""


def _png(array: np.ndarray) -> str:
    """An (H, W, 3) [0, 1] array as a PNG data address."""
    from PIL import Image

    pixels = (np.clip(array, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _photo(photo: np.ndarray) -> np.ndarray:
    array = np.asarray(photo)
    if array.ndim != 3 or array.shape[-1] != 3:
        raise InputError(f"the photo must be (H, W, 3), got {array.shape}")
    return array / 255.0 if array.dtype == np.uint8 else array.astype(np.float64)


def answer_scale(maps: Tensor, signed: bool | None = None) -> FigureScale:
    """The scale both the page and the figure draw the (G, H, W) `maps` with: each map on
    its own range (`scale_maps`' "per_map"), on the one kind `signed` says."""
    return scale_maps([m.detach().cpu().double().numpy() for m in maps], signed=signed)


def _key(scale: FigureScale) -> str:
    """The page's colour key: the figure's colormap as a strip, its ends as the figure's."""
    signed = scale.keys()[-1]  # one kind, where the caller decided it
    ramp = np.linspace(-1.0 if signed else 0.0, 1.0, 96)
    colormap = _colormap(DIVERGING if signed else SEQUENTIAL)
    strip = colormap(0.5 + 0.5 * ramp if signed else ramp)[None, :, :3].repeat(4, axis=0)
    _, labels = scale.key_ticks(signed)
    return (
        f'<div class="key"><span>{html.escape(labels[0])}</span><img id="key" '
        f'src="{_png(strip)}" alt="colour key"><span>{html.escape(labels[-1])}</span>'
        f"<span>({html.escape(scale.key_label(signed))})</span></div>\n"
    )


def answer_html(
    photo: np.ndarray,
    maps: Tensor,
    tokens: Sequence[str],
    relevance: Tensor,
    words: Sequence[str],
    readout: int | None = None,
    *,
    rests_on: Sequence[Sequence[int]],
    title: str = "explain generate",
    signed: bool | None = None,
) -> str:
    """The page for one answer.

    Args:
        photo: (H, W, 3) the photo, uint8 or floats in [0, 1].
        maps: (G, H, W) each answer word's relevance over the photo's pixels
            (`ImagePreprocessing.to_original`).
        tokens: the question's tokens as shown (image runs collapsed to "[image]").
        relevance: (G, len(tokens)) each word's relevance over those tokens.
        words: the G answer words.
        readout: the index in `tokens` the first word is read out at (framed, and left
            out of the colour scale; word g is read out g tokens later, past the
            question); None when it is not among them.
        rests_on: per word, the indices in `tokens` it rests on most, most relevant first
            (explain.viz.ranking.rests_on), written with their values as the terminal
            writes them (explain.viz.ranking.sources_text).
        signed: the maps' one kind of scale (`answer_scale`), as for `answer_figure`.
    """
    picture = _photo(photo)
    count = len(words)
    if maps.dim() != 3 or maps.shape[0] != count or tuple(maps.shape[1:]) != picture.shape[:2]:
        raise InputError(
            f"maps must be (words, H, W) = ({count}, {picture.shape[0]}, {picture.shape[1]}), "
            f"got {tuple(maps.shape)}"
        )
    if relevance.shape != (count, len(tokens)):
        raise InputError(
            f"relevance must be (words, tokens) = ({count}, {len(tokens)}), "
            f"got {tuple(relevance.shape)}"
        )
    if len(rests_on) != count:
        raise InputError(f"{count} words but {len(rests_on)} rests_on lists")
    drawn = answer_scale(maps, signed)
    entries = []
    for g in range(count):
        row = [float(v) for v in relevance[g].detach().cpu().double()]
        at = readout if g == 0 else None
        scale = max((abs(v) for t, v in enumerate(row) if t != at), default=0.0)
        shades = [
            colour(v, scale) if t != at else colour(1.0 if v >= 0 else -1.0, 1.0)
            for t, v in enumerate(row)
        ]
        entries.append(
            {
                "word": words[g],
                "overlay": _png(overlay(picture, drawn.maps[g], signed=drawn.signed[g])),
                "colours": [f"rgb{shade}" for shade in shades],
                # the ink each drawn shade needs, the readout token's full colour too
                "light": [text_colour(shade) == (255, 255, 255) for shade in shades],
                "values": [f"{v:.4g}" for v in row],
                "readout": at if at is not None else -1,
                "rests": sources_text(tokens, row, rests_on[g]),
            }
        )
    # "<" escaped too: the JSON lives in a <script> element, which "</script>" would end.
    data = json.dumps(entries).replace("<", "\\u003c")
    spans = " ".join(f'<span class="tok">{html.escape(t)}</span>' for t in tokens)
    answer = " ".join(
        f'<span class="word" data-g="{g}" tabindex="0" role="button">{html.escape(w)}</span>'
        for g, w in enumerate(words)
    )
    red, blue = colour(1.0, 1.0), colour(-1.0, 1.0)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>\n<body>\n"
        f"<h2>{html.escape(title)}</h2>\n"
        '<p class="legend">Click a word of the answer: its relevance is drawn over the photo '
        "and the question's tokens are coloured by theirs, "
        f'<span style="color: rgb{red}">red</span> for, '
        f'<span style="color: rgb{blue}">blue</span> against, scaled by the largest '
        "magnitude among them without the token the prediction is read out at (framed). "
        # the maps' rule, a sentence of its own: in brackets mid-sentence it read "(Each ...)"
        f"{html.escape(figure_caption(drawn, 'grey'))}</p>\n"
        f"{_key(drawn)}"
        '<p id="status"></p>\n'
        f'<div class="pair"><img id="map" src="{_png(picture)}" alt="the photo">'
        f'<div class="tokens">{spans}</div></div>\n'
        f'<p class="answer">answer: {answer}</p>\n'
        f'<script type="application/json" id="answer">{data}</script>\n'
        f"<script>{_SCRIPT}{_CHOICE}</script>\n"
        "</body></html>\n"
    )


@literal_text
def answer_figure(
    photo: np.ndarray,
    maps: Tensor,
    words: Sequence[str],
    *,
    title: str | None = None,
    maps_per_row: int = MAPS_PER_ROW,
    signed: bool | None = None,
    note: str | None = None,
) -> Figure:
    """Under `title` (e.g. the model, the method and the question), the photo, then one
    panel per answer word with its (G, H, W) map over the photo, titled with the word, in
    reading order (`maps_per_row` words to a row, the photo opening the first); each map
    scaled to its own range on the one kind `signed` says (`answer_scale`), stated by the
    colour key and the caption, which ends with `note` (e.g. what part of the photo the
    model saw)."""
    if maps.dim() != 3 or maps.shape[0] != len(words) or not words:
        raise InputError(
            f"maps must be (words, H, W) for {len(words)} words, got {tuple(maps.shape)}"
        )
    heat = [m.detach().cpu().double().numpy() for m in maps]
    figure, _ = _reading_order_panels(
        _photo(photo),
        heat,
        list(words),
        title=title,
        opening="photo",
        per_row=maps_per_row,
        signed=signed,
        note=note,
    )
    return figure
