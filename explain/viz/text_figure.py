"""Highlighted text as a matplotlib figure, for notebooks and papers (HTML: viz/text.py).

Each token is drawn on a box coloured by its score on a diverging scale centred at zero:
red for evidence for the explained class, blue against, white for none. Tokens are laid
out in a monospace font so that their widths are known without a renderer, and wrap at
`line_width` characters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

from explain.errors import InputError
from explain.viz.literal import literal_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["text_figure"]

_CHAR_INCHES = 0.085
"""Advance of one monospace character at the font size used below (9 pt)."""
_LINE_INCHES = 0.3

LEGEND = (
    "Shading: evidence for the explained output (red), against (blue), none (white); "
    "each text scaled by its own largest |relevance|."
)
"""The figure's last line (with the default diverging colormap): how to read the colours."""


def _layout(tokens: Sequence[str], line_width: int) -> list[tuple[int, int]]:
    """(line, column) of each token's first character, wrapping before `line_width`."""
    places, line, column = [], 0, 0
    for token in tokens:
        if column > 0 and column + len(token) > line_width:
            line, column = line + 1, 0
        places.append((line, column))
        column += len(token) + 1
    return places


@literal_text
def text_figure(
    tokens: Sequence[Sequence[str]],
    scores: Sequence[Sequence[float]] | Tensor,
    *,
    labels: Sequence[str] | None = None,
    cmap: str = "RdBu_r",
    line_width: int = 80,
) -> Figure:
    """One paragraph per text: `tokens[i][t]` highlighted by `scores[i][t]`.

    Scores of each text are scaled by their largest magnitude, so colours compare tokens
    within a text; a text whose scores are all 0 is marked "(every relevance is 0)".
    `scores` may be longer than the token list (padding); the extra
    positions are ignored. `labels[i]` is written above text i (e.g. the explained class).
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    if len(tokens) == 0:
        raise InputError("text_figure needs at least one text")
    if len(scores) != len(tokens):
        raise InputError(f"{len(tokens)} token lists but {len(scores)} score rows")
    if labels is not None and len(labels) != len(tokens):
        raise InputError(f"{len(tokens)} texts but {len(labels)} labels")
    colormap = colormaps[cmap]
    paragraphs = []
    for index, (words, row) in enumerate(zip(tokens, scores, strict=True)):
        values = (
            row.detach().cpu().double().numpy()
            if isinstance(row, Tensor)
            else np.asarray(row, dtype=float)
        )
        if len(values) < len(words):
            raise InputError(f"text {index} has {len(words)} tokens but {len(values)} scores")
        values = values[: len(words)]
        peak = np.abs(values).max() if len(values) else 0.0
        # A map that is zero everywhere is said to be, not left for an empty highlight.
        shown = [*words, "(every relevance is 0)"] if peak == 0 else list(words)
        places = _layout(shown, line_width)
        paragraphs.append((shown, values / peak if peak > 0 else np.zeros(len(shown)), places))
    heights = [
        (places[-1][0] + 1 if places else 1) + (1 if labels is not None else 0)
        for _, _, places in paragraphs
    ]
    total_lines = sum(heights) + len(paragraphs)  # the last line: the legend
    width = _CHAR_INCHES * line_width + 0.4
    height = _LINE_INCHES * total_lines + 0.2
    figure = Figure(figsize=(width, height))
    axis = figure.add_axes((0, 0, 1, 1))
    axis.set_xlim(0, width)
    axis.set_ylim(height, 0)
    axis.axis("off")
    top = 0.1 + _LINE_INCHES / 2
    for index, (words, values, places) in enumerate(paragraphs):
        if labels is not None:
            axis.text(0.2, top, labels[index], fontsize=9, weight="bold", va="center")
            top += _LINE_INCHES
        for word, value, (line, column) in zip(words, values, places, strict=True):
            axis.text(
                0.2 + column * _CHAR_INCHES,
                top + line * _LINE_INCHES,
                word,
                family="monospace",
                parse_math=False,  # a token such as "$5" is text, not mathtext
                fontsize=9,
                va="center",
                color="white" if abs(value) > 0.6 else "black",  # legible on dark boxes
                bbox={
                    "boxstyle": "square,pad=0.15",
                    "facecolor": colormap(0.5 + 0.5 * float(value)),
                    "edgecolor": "none",
                },
            )
        top += _LINE_INCHES * (heights[index] - (1 if labels is not None else 0) + 1)
    axis.text(0.2, top - _LINE_INCHES / 2, LEGEND, fontsize=7, color="#555", va="center")
    return figure
