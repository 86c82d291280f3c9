"""Pictures of two-token-set explanations: CLIP image-text pairs and seq2seq matrices.

- `clip_figure`: one image against several texts side by side (the ICCV 2021 CLIP
  notebook's figure): per text, the image with its heatmap and, below it, the text with
  its tokens highlighted by relevance; a colour key and a caption state the scales.
- `relevance_matrix_figure`: a seq2seq explanation of every generated token, as a
  (generated token) x (source token) relevance matrix.
- `source_text_figure`: the source text highlighted once per generated token.

matplotlib is imported only when something is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

from explain.errors import InputError
from explain.viz.image import (
    _CAPTION_LINE_INCHES,
    _TITLE_LINE_INCHES,
    _draw_colorbar,
    _draw_scaled,
    _to_hwc,
    _to_map,
    caption_lines,
    check_style,
    figure_caption,
)
from explain.viz.literal import literal_text
from explain.viz.scaling import SEQUENTIAL, scale_maps
from explain.viz.text_figure import ink, text_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["clip_figure", "relevance_matrix_figure", "source_text_figure"]

_PANEL_INCHES = 2.4
_LINE_INCHES = 0.22
_CHARS_PER_LINE = 28  # of the 8 pt monospace font in one panel's width


def _values(row: Tensor | Sequence[float]) -> np.ndarray:
    if isinstance(row, Tensor):
        return row.detach().cpu().double().numpy()
    return np.asarray(row, dtype=float)


def _wrap(tokens: Sequence[str]) -> list[list[int]]:
    """Token indices per line, wrapping at the panel's width."""
    lines: list[list[int]] = [[]]
    used = 0
    for index, token in enumerate(tokens):
        if lines[-1] and used + len(token) > _CHARS_PER_LINE:
            lines.append([])
            used = 0
        lines[-1].append(index)
        used += len(token) + 1
    return lines


@literal_text
def clip_figure(
    image: Tensor | np.ndarray,
    heatmaps: Tensor | np.ndarray | Sequence[Tensor | np.ndarray],
    tokens: Sequence[Sequence[str]],
    text_scores: Tensor | Sequence[Sequence[float]],
    *,
    labels: Sequence[str] | None = None,
    cmap: str | None = None,
    alpha: float = 0.8,
    background: str = "grey",
    title: str | None = None,
) -> Figure:
    """One image explained against K texts, side by side, under `title` (e.g. the image
    and the method).

    Each image map is scaled on its own (min-max; explain.viz.scaling) and drawn with
    opacity following relevance over the image in grey (`background`, see
    explain.viz.overlay); a colour key at the right and a caption below, wrapped to the
    figure's width, say so.

    Args:
        image: (3, H, W) or (H, W, 3) in [0, 1].
        heatmaps: K relevance maps (H, W), e.g. `Explanation.heatmap()` of each pair.
        tokens: K token lists, the texts to show (special tokens may be dropped first).
        text_scores: K rows of token relevance, aligned with `tokens` (longer rows, e.g.
            with padding, are cut); each row is scaled by its own maximum.
        labels: K titles, e.g. the prompt and its similarity or probability.
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    check_style(cmap, alpha, background)
    count = len(tokens)
    if count == 0:
        raise InputError("clip_figure needs at least one text")
    if len(heatmaps) != count or len(text_scores) != count:
        raise InputError(
            f"{count} texts but {len(heatmaps)} heatmaps and {len(text_scores)} score rows"
        )
    if labels is not None and len(labels) != count:
        raise InputError(f"{count} texts but {len(labels)} labels")
    wrapped = [_wrap(words) for words in tokens]
    text_lines = max(len(lines) for lines in wrapped)
    heading = 0.3 if title is not None else 0.0
    labels_h = 0.3 if labels is not None else 0.05
    scale = scale_maps([_to_map(heat) for heat in heatmaps])
    rgb = _to_hwc(image)
    panels_width = count * (_PANEL_INCHES + 0.1) + 0.1
    width = panels_width + 1.1  # the colour key and its labels
    image_rule = figure_caption(scale, background)
    lines = caption_lines(
        f"Image: {image_rule[0].lower()}{image_rule[1:]} Text: each prompt's tokens shaded by "
        "their relevance over the prompt's largest (white: none).",
        width,
    )
    caption = 0.1 + _CAPTION_LINE_INCHES * len(lines)
    text_height = text_lines * _LINE_INCHES + 0.15 + caption
    height = heading + labels_h + _PANEL_INCHES + text_height
    figure = Figure(figsize=(width, height))
    reds = colormaps["Reds"]
    key = ((panels_width + 0.1) / width, text_height / height, 0.15 / width, _PANEL_INCHES / height)
    _draw_colorbar(figure, key, scale, cmap)
    for k in range(count):
        left = 0.1 + k * (_PANEL_INCHES + 0.1)
        axis = figure.add_axes(
            (left / width, text_height / height, _PANEL_INCHES / width, _PANEL_INCHES / height)
        )
        _draw_scaled(
            axis,
            rgb,
            scale,
            k,
            cmap,
            alpha,
            background=background,
        )
        if labels is not None:
            axis.set_title(labels[k], fontsize=8, parse_math=False)
        scores = _values(text_scores[k])
        if len(scores) < len(tokens[k]):
            raise InputError(f"text {k} has {len(tokens[k])} tokens but {len(scores)} scores")
        scores = scores[: len(tokens[k])]
        peak = scores.max() if len(scores) and scores.max() > 0 else 1.0
        for line, indices in enumerate(wrapped[k]):
            column = 0
            for index in indices:
                value = float(np.clip(scores[index] / peak, 0.0, 1.0))
                figure.text(
                    (left + 0.05 + column * 0.082) / width,
                    (text_height - 0.12 - line * _LINE_INCHES) / height,
                    tokens[k][index],
                    family="monospace",
                    fontsize=8,
                    parse_math=False,
                    va="top",
                    color=ink(reds(value)),
                    bbox={
                        "boxstyle": "square,pad=0.1",
                        "facecolor": reds(value),
                        "edgecolor": "none",
                    },
                )
                column += len(tokens[k][index]) + 1
    figure.text(0.5, 0.06 / height, "\n".join(lines), ha="center", va="bottom", fontsize=7)
    if title is not None:
        figure.text(0.5, 1 - 0.08 / height, title, ha="center", va="top", fontsize=9,
                    parse_math=False)  # fmt: skip
    return figure


@literal_text
def relevance_matrix_figure(
    matrix: Tensor | np.ndarray,
    source_tokens: Sequence[str],
    target_tokens: Sequence[str],
    *,
    cmap: str = SEQUENTIAL,
    normalize_rows: bool = True,
    title: str | None = None,
) -> Figure:
    """(P, S) relevance of S source tokens for each of P explained target tokens, under
    `title` (e.g. the model and the method), the scaling rule written below.

    Row i is the source relevance of `target_tokens[i]`; with `normalize_rows` each row is
    scaled to its own maximum, so that tokens with little total relevance stay readable.
    """
    from matplotlib.figure import Figure

    values = _values(matrix) if isinstance(matrix, Tensor) else np.asarray(matrix, dtype=float)
    if not source_tokens or not target_tokens:
        raise InputError("a relevance matrix needs at least one source and one target token")
    if values.ndim != 2 or values.shape != (len(target_tokens), len(source_tokens)):
        raise InputError(
            f"the matrix must be (targets, sources) = ({len(target_tokens)}, "
            f"{len(source_tokens)}), got {values.shape}"
        )
    if normalize_rows:
        peaks = np.abs(values).max(axis=1, keepdims=True)
        values = np.divide(values, peaks, out=np.zeros_like(values), where=peaks > 0)
    cell = 0.32
    # Margins fit the longest tick label (8 pt, about 0.075 inch a character); the panel
    # is at least readable with one explained token (its cells stretch, not shrink).
    left = 0.5 + 0.075 * max(len(t) for t in target_tokens)
    panel_w = max(cell * len(source_tokens), 2.0)
    panel_h = max(cell * len(target_tokens), 1.2)
    width = left + panel_w + 1.0
    heading = caption_lines(title, width, title=True) if title else []
    top = 0.2 + _TITLE_LINE_INCHES * len(heading) + 0.3 + 0.075 * max(map(len, source_tokens))
    rule = (
        "Each row (an explained token) scaled to its own largest |relevance|."
        if normalize_rows
        else "Relevance on one scale for every row."
    )
    lines = caption_lines(rule, width)
    bottom = 0.15 + _CAPTION_LINE_INCHES * len(lines)
    height = top + panel_h + bottom
    figure = Figure(figsize=(width, height))
    axis = figure.add_axes((left / width, bottom / height, panel_w / width, panel_h / height))
    image = axis.imshow(values, cmap=cmap, aspect="auto", vmin=0.0 if normalize_rows else None)
    axis.set_xticks(range(len(source_tokens)), source_tokens, rotation=90, fontsize=8)
    axis.set_yticks(range(len(target_tokens)), target_tokens, fontsize=8)
    axis.xaxis.tick_top()
    axis.set_ylabel("explained token", fontsize=8)
    bar = figure.add_axes(
        ((left + panel_w + 0.2) / width, bottom / height, 0.12 / width, panel_h / height)
    )
    colour_bar = figure.colorbar(image, cax=bar)
    colour_bar.ax.tick_params(labelsize=7)
    colour_bar.set_label("row's own scale" if normalize_rows else "relevance", fontsize=7)
    figure.text(0.5, 0.06 / height, "\n".join(lines), ha="center", va="bottom", fontsize=7)
    if heading:
        figure.text(0.5, 1 - 0.08 / height, "\n".join(heading), ha="center", va="top",
                    fontsize=9, parse_math=False)  # fmt: skip
    for text in axis.get_xticklabels() + axis.get_yticklabels():
        text.set_parse_math(False)
    return figure


@literal_text
def source_text_figure(
    matrix: Tensor | np.ndarray,
    source_tokens: Sequence[str],
    target_tokens: Sequence[str],
) -> Figure:
    """The source text highlighted once per explained target token (row i of `matrix`)."""
    rows = _values(matrix) if isinstance(matrix, Tensor) else np.asarray(matrix, dtype=float)
    return text_figure(
        [list(source_tokens)] * len(target_tokens),
        [list(row) for row in rows],
        labels=[f"-> {token}" for token in target_tokens],
    )
