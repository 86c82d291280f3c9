"""A generated continuation as a (generated token) x (token read) relevance matrix figure.

The figure says what the HTML page (explain.viz.generation) says, on paper:

- row g is the relevance of every token before generated token g for that token, scaled
  by the largest |relevance| in the row *without* the token the prediction is read out at
  (the one just before it): that token's own identity term would otherwise be 1 in every
  row and swamp the rest. The readout cell is drawn grey and hatched, off the scale, inset
  in its cell: the first rows' readout cells border the prompt's end, whose black line
  (drawn over them, and past the panel's edges) must not read as their outline;
- the tokens each row rests on most are numbered 1, 2, 3 in their cells: the ranking the
  terminal's lines and the page's status line give (explain.viz.ranking, by |relevance|,
  the readout token left out);
- tokens at or after the explained one are not read by it: they are left blank, never
  drawn as zeros; the last token (read by nothing) gets no column;
- unsigned relevance uses inferno, signed relevance the diverging red-blue scale, as
  every other figure; the title names the method, the axes say what they hold.

matplotlib is imported only when something is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

from explain.errors import InputError
from explain.viz.image import _CAPTION_LINE_INCHES, _TITLE_LINE_INCHES, caption_lines
from explain.viz.literal import literal_text
from explain.viz.ranking import rests_on
from explain.viz.scaling import DIVERGING, SEQUENTIAL
from explain.viz.text_figure import ink

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["generation_figure", "scale_generation_rows"]

_COLUMN_INCHES = 0.2  # a token read: room for its rotated 8 pt label
_ROW_INCHES = 0.32  # a generated token: room for its label and the ranks' digits
_CHAR_INCHES = 0.075  # an 8 pt tick label character, on average
_READOUT_INSET = 0.08  # of a cell, on each side of the hatched readout cell
_BOUNDARY_OVERHANG_INCHES = 0.1  # the prompt's end, drawn past the panel's top and bottom


def scale_generation_rows(matrix: np.ndarray, prompt_length: int) -> np.ndarray:
    """(G, T) relevance -> (G, T - 1) display values: row g divided by its largest
    |relevance| among tokens `0 .. prompt_length + g - 2` (the readout token at
    `prompt_length + g - 1` left out of the scale), NaN at the readout token and at every
    token from the explained one on; the last token (read by no row) dropped."""
    count, tokens = matrix.shape
    shown = np.full((count, tokens - 1), np.nan)
    for g in range(count):
        readout = prompt_length + g - 1
        before = matrix[g, :readout]
        peak = float(np.abs(before).max()) if before.size else 0.0
        shown[g, :readout] = before / peak if peak > 0 else 0.0
    return shown


@literal_text
def generation_figure(
    matrix: Tensor | np.ndarray,
    tokens: Sequence[str],
    prompt_length: int,
    *,
    method: str,
    title: str | None = None,
) -> Figure:
    """The relevance matrix of a generated continuation.

    Args:
        matrix: (G, T) relevance, row g for the token at `prompt_length + g` over all T
            tokens (prompt, then continuation), as explain.generation returns it.
        tokens: the T tokens, prompt first.
        prompt_length: how many of `tokens` are the prompt.
        method: the method that made the relevance, named in the title.
        title: what was explained (e.g. the model); the title reads "TITLE (METHOD)".
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    values = (
        matrix.detach().cpu().double().numpy()
        if isinstance(matrix, Tensor)
        else np.asarray(matrix, dtype=float)
    )
    if values.ndim != 2 or values.shape[1] != len(tokens):
        raise InputError(
            f"the matrix must be (generated, tokens) with {len(tokens)} tokens, got {values.shape}"
        )
    count = values.shape[0]
    if count == 0 or not 0 < prompt_length <= len(tokens) - count:
        raise InputError(
            f"{count} generated tokens after a prompt of {prompt_length} do not fit in "
            f"{len(tokens)} tokens"
        )
    if not np.isfinite(values).all():
        raise InputError("the relevance holds NaN or infinite values; nothing can be drawn")
    shown = scale_generation_rows(values, prompt_length)
    signed = bool(np.nanmin(shown) < 0) if np.isfinite(shown).any() else False
    colormap = colormaps[DIVERGING if signed else SEQUENTIAL].with_extremes(bad="white")
    read = tokens[:-1]
    generated = tokens[prompt_length : prompt_length + count]
    left = 0.7 + _CHAR_INCHES * max(len(t) for t in generated)
    # At least a readable area: with one generated token the cells stretch, not shrink.
    panel_w, panel_h = max(_COLUMN_INCHES * len(read), 2.5), max(_ROW_INCHES * count, 1.2)
    width = left + panel_w + 1.3
    heading = caption_lines(f"{title} ({method})" if title else method, width, title=True)
    top = 0.55 + _TITLE_LINE_INCHES * len(heading) + _CHAR_INCHES * max(len(t) for t in read)
    rule = (
        "Each row scaled by its largest |relevance| without the readout token (hatched grey: "
        "the token the prediction is read out at, its own identity term, off the scale). "
        "Blank: tokens at or after the explained one, which it does not read. 1, 2, 3: the "
        "tokens the row rests on most, by |relevance|. Black line: the prompt's end."
    )
    if signed:
        rule += " Red for, blue against."
    lines = caption_lines(rule, width)
    bottom = 0.3 + _CAPTION_LINE_INCHES * len(lines)
    height = top + panel_h + bottom
    figure = Figure(figsize=(width, height))
    axis = figure.add_axes((left / width, bottom / height, panel_w / width, panel_h / height))
    image = axis.imshow(
        np.ma.masked_invalid(shown),
        cmap=colormap,
        vmin=-1.0 if signed else 0.0,
        vmax=1.0,
        aspect="auto",
        interpolation="nearest",
    )
    for g in range(count):
        readout = prompt_length + g - 1
        axis.add_patch(
            Rectangle(
                (readout - 0.5 + _READOUT_INSET, g - 0.5 + _READOUT_INSET),
                1 - 2 * _READOUT_INSET,
                1 - 2 * _READOUT_INSET,
                facecolor="#bbbbbb",
                edgecolor="#777777",
                hatch="///",
                linewidth=0.5,
                gid="readout",
            )
        )
    for g in range(count):  # the ranking every view gives, in the cells it names
        for rank, t in enumerate(rests_on(values[g], prompt_length + g - 1), start=1):
            cell = image.cmap(image.norm(shown[g, t]))
            axis.text(t, g, str(rank), ha="center", va="center", fontsize=7, color=ink(cell))
    overhang = _BOUNDARY_OVERHANG_INCHES / panel_h
    axis.axvline(
        prompt_length - 0.5,
        ymin=-overhang,
        ymax=1 + overhang,
        color="black",
        linewidth=1.5,
        clip_on=False,
        zorder=3,  # over the hatched cells (patches are drawn at 1)
        gid="prompt-end",
    )
    axis.set_xticks(range(len(read)), read, rotation=90, fontsize=8)
    axis.set_yticks(range(count), generated, fontsize=8)
    axis.xaxis.tick_top()
    axis.xaxis.set_label_position("top")
    axis.set_xlabel("token read (prompt | continuation)", fontsize=8)
    axis.set_ylabel("generated token explained", fontsize=8)
    figure.text(0.5, 1 - 0.08 / height, "\n".join(heading), ha="center", va="top", fontsize=9)
    bar = figure.add_axes(
        ((left + panel_w + 0.25) / width, bottom / height, 0.12 / width, panel_h / height)
    )
    key = figure.colorbar(image, cax=bar)
    key.set_ticks([-1.0, 0.0, 1.0] if signed else [0.0, 1.0])
    key.set_label("row's own scale", fontsize=7)
    key.ax.tick_params(labelsize=7)
    figure.text(0.5, 0.06 / height, "\n".join(lines), ha="center", va="bottom", fontsize=7)
    return figure
