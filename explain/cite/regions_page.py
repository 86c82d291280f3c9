"""A region citation of a photo as a picture, a figure and a page that show the same thing.

`region_picture` is the photo with each region tinted by its score on the diverging
scale of explain.viz.text (red for, blue against, full colour at the largest |score|)
and outlined, dark or light, whichever contrasts more with the photo around it; the
figure (`regions_figure`) draws that picture with each region's rank at its centre and a
key in relevance units beside it, and the ranked scores as bars; the page
(`regions_html`) embeds the very same picture as a PNG, the ranked regions, and the
ablation check. With a text context beside the photo its spans are ranked with the
regions and, on the page, shown coloured on the regions' key (one largest |score| over
both). matplotlib is imported only when something is drawn.
"""

from __future__ import annotations

import html
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import Tensor

from explain.cite.figure import span_label
from explain.cite.page import CHOICE_STYLE, PRESS_SCRIPT, _check_table, _json, choice_button
from explain.cite.regions import Region
from explain.cite.verdict import number
from explain.errors import InputError
from explain.viz.choice_script import choice_script
from explain.viz.image_answer import _png
from explain.viz.literal import literal_text
from explain.viz.text import colour, text_colour

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["TINT", "region_picture", "regions_figure", "regions_html"]

TINT = 0.6
"""How much of a region's colour covers the photo at full |score| (the rest: the photo)."""
_EDGE = np.array([0.15, 0.15, 0.15])  # on a light photo
_LIGHT_EDGE = np.array([0.92, 0.92, 0.92])  # on a dark one, where the dark edge vanished
_CAPTION_CHARS = 130  # an 8 pt caption line across the 9-inch figure


def _scores(regions: Sequence[Region], scores: Tensor | Sequence[float]) -> np.ndarray:
    values = np.asarray([float(s) for s in scores], dtype=np.float64)
    if len(values) != len(regions) or not len(values):
        raise InputError(f"{len(regions)} regions but {len(values)} scores")
    if not np.isfinite(values).all():
        raise InputError("a region's score is NaN or infinite; nothing can be drawn")
    return values


def region_picture(
    photo: np.ndarray,
    regions: Sequence[Region],
    scores: Tensor | Sequence[float],
    scale: float | None = None,
) -> np.ndarray:
    """(H, W, 3) in [0, 1]: the photo with each region's pixels blended with its colour
    (`colour(score, scale)`, weight `TINT` times |score| / scale; `scale` default max
    |score|, or a larger one shared with other sources) and its edge drawn dark or light,
    whichever contrasts more with the photo just outside the region (`_edge`); regions
    drawn lowest score first, so an overlap shows the higher."""
    values = _scores(regions, scores)
    picture = np.asarray(photo, dtype=np.float64) / 255.0
    if picture.ndim != 3 or picture.shape[-1] != 3:
        raise InputError(f"the photo must be (H, W, 3), got {picture.shape}")
    scale = float(np.abs(values).max()) if scale is None else scale
    original = picture.copy()
    for index in np.argsort(values, kind="stable"):
        mask = regions[index].mask
        shade = np.asarray(colour(values[index], scale)) / 255.0
        weight = TINT * (abs(values[index]) / scale if scale > 0 else 0.0)
        picture[mask] = (1 - weight) * picture[mask] + weight * shade
        inner, outer = _shrunk(mask), ~_shrunk(~mask)
        picture[mask & ~inner] = _edge(original[outer & ~mask])
    return picture


def _shrunk(mask: np.ndarray) -> np.ndarray:
    """`mask` less its boundary pixels (those with a 4-neighbour outside it)."""
    inner = mask.copy()
    inner[1:] &= mask[:-1]
    inner[:-1] &= mask[1:]
    inner[:, 1:] &= mask[:, :-1]
    inner[:, :-1] &= mask[:, 1:]
    return inner


def _edge(around: np.ndarray) -> np.ndarray:
    """A region's outline colour: dark, or light where the photo's (N, 3) pixels `around`
    the region are dark (by the contrast text_colour weighs); dark when nothing is around
    (a region that fills the photo)."""
    if not len(around):
        return _EDGE
    mean = tuple(round(float(c) * 255) for c in around.mean(axis=0))
    return _EDGE if text_colour(mean) == (0, 0, 0) else _LIGHT_EDGE


def _ranks(values: np.ndarray) -> list[int]:
    return np.argsort(-values, kind="stable").tolist()


@literal_text
def regions_figure(
    photo: np.ndarray,
    regions: Sequence[Region],
    scores: Tensor | Sequence[float],
    *,
    caption: str = "",
    title: str | None = None,
    spans: Sequence[str] = (),
) -> Figure:
    """The `region_picture` with each region's rank (1: the highest score) at its box's
    centre and a key from -max |score| to +max |score|; beside it the regions' scores as
    bars, highest first, named; `caption` (the check) below. With the `spans` of a
    context beside the photo, `scores` holds the regions' and then the spans' (as for
    `regions_html`): the key's max |score| is over both, and the ranks and the bars
    rank both."""
    import matplotlib.pyplot as plt
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import LinearSegmentedColormap, Normalize

    count = len(regions)
    every = np.asarray([float(v) for v in scores])
    if len(every) != count + len(spans):
        raise InputError(f"{count} regions and {len(spans)} spans but {len(every)} scores")
    values = _scores(regions, every[:count])
    every = np.concatenate([values, every[count:]])
    scale = float(np.abs(every).max()) or 1.0
    picture = region_picture(photo, regions, values, scale)
    order = _ranks(every)  # one ranking over both: a region's number is its bar's
    figure, (left, right) = plt.subplots(
        1, 2, figsize=(9.0, 4.2), gridspec_kw={"width_ratios": [1.3, 1.0]}, layout="constrained"
    )
    left.imshow(picture)
    left.set_xticks([])
    left.set_yticks([])
    box = {"boxstyle": "round,pad=0.2", "facecolor": "white", "alpha": 0.8}
    for rank, index in enumerate(order, start=1):
        if index >= count:  # a span: ranked in the bars only
            continue
        x0, y0, x1, y1 = regions[index].box
        left.text((x0 + x1) / 2 - 0.5, (y0 + y1) / 2 - 0.5, str(rank), ha="center",
                  va="center", fontsize=8, bbox=box)  # fmt: skip
    ends = [np.asarray(colour(v, 1.0)) / 255.0 for v in (-1.0, 0.0, 1.0)]
    diverging = LinearSegmentedColormap.from_list("explain_text", ends)
    key = ScalarMappable(norm=Normalize(-scale, scale), cmap=diverging)
    figure.colorbar(key, ax=left, fraction=0.05, pad=0.02).set_label(
        f"{'region and span' if spans else 'region'} score (red for, blue against)", fontsize=8
    )
    sources = [region.name for region in regions]
    sources += [span_label(s, text) for s, text in enumerate(spans)]
    shown = order[:12]
    names = [f"{rank}. {sources[i]}" for rank, i in enumerate(shown, start=1)]
    bars = [every[i] for i in shown]
    right.barh(range(len(shown)), bars, color=[np.asarray(colour(v, scale)) / 255 for v in bars],
               edgecolor="#555")  # fmt: skip
    right.set_yticks(range(len(shown)), labels=names, fontsize=8)
    right.invert_yaxis()
    right.axvline(0.0, color="#555", linewidth=0.8)
    right.set_xlabel("score for the whole answer", fontsize=8)
    right.tick_params(axis="x", labelsize=7)
    if title:
        figure.suptitle(title, fontsize=10)
    if caption:
        figure.supxlabel(textwrap.fill(caption, _CAPTION_CHARS), fontsize=8)
    return figure


def _ranked_list(names: Sequence[str], values: np.ndarray, scale: float, g: int) -> str:
    """Choice `g`'s sources (`names`, escaped HTML), highest score first, each with its
    swatch on `scale` and its score."""
    items = "".join(
        f'<li><span class="swatch" style="background: rgb{colour(values[i], scale)}"></span> '
        f"{number(float(values[i]), signed=True)} &nbsp; {names[i]}</li>"
        for i in _ranks(values)
    )
    named = ' id="ranked"' if g == 0 else ""
    return f'<ol class="ranked"{named} data-g="{g}"{" hidden" if g else ""}>{items}</ol>\n'


def regions_html(
    photo: np.ndarray,
    regions: Sequence[Region],
    scores: Tensor | Sequence[float],
    question: str,
    answer: str,
    *,
    sentences: Sequence[str] = (),
    sentence_scores: Tensor | Sequence[Sequence[float]] = (),
    check: Mapping[str, Any] | None = None,
    title: str = "explain cite",
    spans: Sequence[str] = (),
) -> str:
    """The page: the question and the answer, the `region_picture` (the PNG's picture,
    pixel for pixel), the regions ranked with their scores and boxes, and the check
    (`Check.to_dict`) with its verdict, as the text page shows them.

    With `sentences` (the answer's N sentences) and `sentence_scores` (N, R: each one's
    region scores, `RegionCitation.statement_relevance`), each sentence is a choice
    beside the whole answer (click, or Tab and Enter; `#c` opens choice c, 1 the whole
    answer): the picture and the ranking become that sentence's, each choice's picture
    the `region_picture` of its scores, on its own largest |score|.

    With the S `spans` of a text context given beside the photo, `scores` (R + S) and
    each row of `sentence_scores` hold the regions' scores and then the spans': the
    context is shown with each span coloured on the scale of its choice's regions (one
    largest |score| over both, one key), ranked with them, and a sentence's choice
    colours both."""
    count = len(regions)
    names = [
        f"{html.escape(region.name)} (box {', '.join(str(v) for v in region.box)})"
        for region in regions
    ]
    names += [f"span {s + 1}: {html.escape(' '.join(t.split()))}" for s, t in enumerate(spans)]
    values = [np.asarray([float(v) for v in row]) for row in [scores, *sentence_scores]]
    for row in values:
        if len(row) != len(names):
            raise InputError(f"{count} regions and {len(spans)} spans but {len(row)} scores")
        _scores(regions, row[:count])
    if len(values) != len(sentences) + 1:
        raise InputError(f"{len(sentences)} sentences but {len(values) - 1} rows of scores")
    scales = [float(np.abs(row).max()) for row in values]
    pictures = [
        _png(region_picture(photo, regions, row[:count], scale))
        for row, scale in zip(values, scales, strict=True)
    ]
    colours = [
        [_span_colour(value, scale) for value in row[count:]]
        for row, scale in zip(values, scales, strict=True)
    ]
    sources = "regions and spans" if spans else "regions"
    table = "" if check is None else _check_table(check, sources)
    red, blue = colour(1.0, 1.0), colour(-1.0, 1.0)
    which, choices, script = "the whole answer", "", ""
    if sentences:
        labels = ["the whole answer"]
        labels += [
            f"sentence {n + 1} of the answer: {text.strip()}" for n, text in enumerate(sentences)
        ]
        said = " ".join(choice_button(n + 1, text.strip()) for n, text in enumerate(sentences))
        whole = choice_button(0, "whole answer")
        choices = f'<p>{whole} | by sentence: {said}</p>\n<p id="status"></p>\n'
        which = "the chosen statement (the whole answer or one of its sentences)"
        shown = [
            f"{label}, full colour at {number(scale)}"
            for label, scale in zip(labels, scales, strict=True)
        ]
        script = (
            f'<script type="application/json" id="pictures">{_json(pictures)}</script>\n'
            f'<script type="application/json" id="span-colours">{_json(colours)}</script>\n'
            f'<script type="application/json" id="choice-labels">{_json(shown)}</script>\n'
            f"<script>{_SCRIPT}{_CHOICE}</script>\n"
        )
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>\n<body>\n"
        f"<h2>{html.escape(title)}</h2>\n"
        f"<p>question: {html.escape(question)}<br>answer: {html.escape(answer)}</p>\n"
        f'<p class="legend">Each region{" and each span of the context" if spans else ""} '
        f'is tinted by its score for {which}, <span style="color: rgb{red}">red</span> for, '
        f'<span style="color: rgb{blue}">blue</span> against, full colour at the largest '
        f"|score| ({number(scales[0])} for the whole answer){_ONE_SCALE if spans else ''}; "
        "the regions are outlined.</p>\n"
        f"{choices}"
        f'<img id="regions" src="{pictures[0]}" alt="the photo with its regions">\n'
        + _context_block(spans, colours[0])
        + "".join(
            _ranked_list(names, row, scale, g)
            for g, (row, scale) in enumerate(zip(values, scales, strict=True))
        )
        + f"{table}{script}"
        "</body></html>\n"
    )


_SCRIPT = (
    PRESS_SCRIPT
    + """
const pictures = JSON.parse(document.getElementById("pictures").textContent);
const labels = JSON.parse(document.getElementById("choice-labels").textContent);
const spanColours = JSON.parse(document.getElementById("span-colours").textContent);
function choose(g) {
  document.getElementById("regions").src = pictures[g];
  document.querySelectorAll("span.src").forEach(span => {
    const [background, ink] = spanColours[g][Number(span.dataset.s)];
    span.style.backgroundColor = background;
    span.style.color = ink;
  });
  document.querySelectorAll("ol.ranked").forEach(list => {
    list.hidden = Number(list.dataset.g) !== g;
  });
  press(g);
  document.getElementById("status").textContent =
    "scores for " + labels[g] + " (address #" + (g + 1) + ")";
}
"""
)
_CHOICE = choice_script("span.choice", "pictures")
_ONE_SCALE = (
    " over the regions and the spans together: both are shares of the one relevance of "
    "the answer, so they share one scale"
)


def _span_colour(value: float, scale: float) -> tuple[str, str]:
    """A span's background on `scale` (the regions' key) and its text's colour."""
    background = colour(value, scale)
    return f"rgb{background}", f"rgb{text_colour(background)}"


def _context_block(spans: Sequence[str], colours: Sequence[tuple[str, str]]) -> str:
    """The context beside the photo, each span coloured (`colours`: the first choice's)."""
    if not spans:
        return ""
    shown = "".join(
        f'<span class="src" data-s="{s}" style="background-color: {background}; color: '
        f'{ink}">{html.escape(text)}</span>'
        for s, (text, (background, ink)) in enumerate(zip(spans, colours, strict=True))
    )
    return f'<p class="context">context: {shown}</p>\n'


_STYLE = (
    CHOICE_STYLE
    + """
body { font-family: sans-serif; max-width: 60em; margin: 2em auto; line-height: 1.6; }
img#regions { max-width: 32em; width: 100%; image-rendering: pixelated; border: 1px solid #ccc; }
span.swatch { display: inline-block; width: 1em; height: 1em; border: 1px solid #555;
  vertical-align: middle; }
p.legend, p.note { color: #555; line-height: 1.4; }
p.context { white-space: pre-wrap; line-height: 1.8; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: right; }
"""
)
