"""A span attribution as a figure: the top spans' scores for the whole answer (bars), and
their relevance for each answer token (a matrix), with the ablation check and its
verdict (explain.cite.verdict) in the caption.

The figure says on paper what the page (explain.cite.page) says: the spans are the
`TOP_SPANS` with the highest score, labelled by their number and their words (the
first and last of a long span, `span_label`); the bars are their scores (red for,
blue against); the matrix is scaled by its largest |value| on the diverging red-blue
scale, with its key (relevance units) beside it. matplotlib is imported only when
something is drawn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import Tensor

from explain.cite.check import Check
from explain.cite.verdict import number, random_sets
from explain.errors import InputError
from explain.viz.image import _CAPTION_LINE_INCHES, _TITLE_LINE_INCHES, caption_lines
from explain.viz.literal import literal_text
from explain.viz.scaling import DIVERGING
from explain.viz.text import colour

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["TOP_SPANS", "cite_figure", "span_label"]

TOP_SPANS = 10
_LABEL_CHARS = 48
_CELL_INCHES = 0.32
_CHAR_INCHES = 0.075  # an 8 pt tick label character, on average


def span_label(index: int, text: str) -> str:
    """ "[n] the span's words" on one line (n counted from 1); a span longer than
    `_LABEL_CHARS` keeps its first and its last words around " … ", cut at word
    boundaries, since a span's fact is as often at its end as at its start (a single
    word too long for its half is cut inside it)."""
    flat = " ".join(text.split())
    return f"[{index + 1}] {_shortened(flat, _LABEL_CHARS)}"


def _shortened(flat: str, limit: int) -> str:
    """`flat` (single-spaced) in at most `limit` characters: whole, or its head and its
    tail joined by " … ", each cut back to a word boundary unless that leaves nothing."""
    if len(flat) <= limit:
        return flat
    room = limit - len(" … ")
    head = flat[: (room + 1) // 2]
    if flat[len(head)] != " " and " " in head:
        head = head[: head.rindex(" ")]
    tail = flat[len(flat) - (room - len(head)) :]
    if flat[-len(tail) - 1] != " " and " " in tail:
        tail = tail[tail.index(" ") + 1 :]
    return f"{head.strip()} … {tail.strip()}"


def _check_caption(values: Mapping[str, Any] | None) -> str:
    if values is None:
        return "No ablation check run."
    check = Check.from_dict(dict(values))
    parts = [
        f"top-{d.k} removed: drop {number(d.top)} (random {number(d.random)} ± "
        f"{number(d.random_std)}, {random_sets(d)})"
        for d in check.drops
    ]
    if check.lds_ablations:
        parts.append(f"LDS {'undefined' if check.lds is None else number(check.lds)}")
    return (
        f"Check, drop of {check.target}: " + "; ".join(parts) + f". Verdict: {check.verdict.word}."
    )


@literal_text
def cite_figure(
    spans: Sequence[str],
    answer_tokens: Sequence[str],
    span_relevance: Tensor | np.ndarray,
    *,
    method: str,
    check: Mapping[str, Any] | None = None,
    title: str | None = None,
    note: str = "",
) -> Figure:
    """The figure of one answer.

    Args:
        spans: the S spans' texts.
        answer_tokens: the G answer tokens (the rows of the matrix).
        span_relevance: (G + 1, S) as for explain.cite.page.cite_html: row 0 the whole
            answer's scores, row g + 1 answer token g's.
        method: the method, named in the title after `title` (what was explained), as
            the regions figure names it.
        check: the ablation check (`Check.to_dict`), summarised in the caption.
        note: what the scores are where not all are the method's (`Citation.ablated_note`):
            the caption says it in place of "the sum of their tokens' relevance".
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    values = (
        span_relevance.detach().cpu().double().numpy()
        if isinstance(span_relevance, Tensor)
        else np.asarray(span_relevance, dtype=float)
    )
    count = len(answer_tokens)
    if values.shape != (count + 1, len(spans)) or count == 0:
        raise InputError(
            f"span_relevance must be (answer tokens + 1, spans) = ({count + 1}, {len(spans)}), "
            f"got {values.shape}"
        )
    if not np.isfinite(values).all():
        raise InputError("the span relevances hold NaN or infinite values; nothing is drawn")
    order = np.argsort(-values[0], kind="stable")[:TOP_SPANS]
    labels = [span_label(int(s), spans[s]) for s in order]
    scores = values[0, order]
    matrix = values[1:, order].T  # (top spans, G)
    label_w = 0.4 + _CHAR_INCHES * max(len(label) for label in labels)
    bars_w = 2.2
    matrix_w = max(_CELL_INCHES * count, 1.5)
    panel_h = max(_CELL_INCHES * len(order), 1.2)
    width = label_w + bars_w + 0.3 + matrix_w + 1.0
    heading = caption_lines(f"{title} ({method})" if title else method, width, title=True)
    top = 0.45 + _TITLE_LINE_INCHES * len(heading) + _CHAR_INCHES * max(map(len, answer_tokens))
    scores_are = (
        f". {note}" if note else " (the sum of their tokens' relevance over the answer's tokens)."
    )
    rule = (
        f"Left: the top spans' scores for the whole answer{scores_are} Right: each span's "
        "relevance for each answer token, scaled by the largest magnitude; red for, blue "
        "against. " + _check_caption(check)
    )
    lines = caption_lines(rule, width)
    bottom = 0.45 + _CAPTION_LINE_INCHES * len(lines)
    height = top + panel_h + bottom
    figure = Figure(figsize=(width, height))
    bars = figure.add_axes((label_w / width, bottom / height, bars_w / width, panel_h / height))
    peak = float(np.abs(scores).max()) or 1.0
    bars.barh(
        range(len(order)),
        scores,
        color=[tuple(c / 255 for c in colour(float(v), peak)) for v in scores],
        edgecolor="#555555",
        linewidth=0.5,
    )
    bars.set_yticks(range(len(order)), labels, fontsize=8)
    bars.set_ylim(len(order) - 0.5, -0.5)
    bars.axvline(0.0, color="#555555", linewidth=0.8)
    bars.tick_params(axis="x", labelsize=7)
    bars.set_xlabel("score (whole answer)", fontsize=8)
    grid = figure.add_axes(
        ((label_w + bars_w + 0.3) / width, bottom / height, matrix_w / width, panel_h / height)
    )
    reach = float(np.abs(matrix).max()) or 1.0
    image = grid.imshow(
        matrix,
        cmap=colormaps[DIVERGING],
        vmin=-reach,
        vmax=reach,
        aspect="auto",
        interpolation="nearest",
    )
    grid.set_yticks([])
    grid.set_xticks(range(count), list(answer_tokens), rotation=90, fontsize=8)
    grid.xaxis.tick_top()
    grid.xaxis.set_label_position("top")
    grid.set_xlabel("answer token", fontsize=8)
    left = label_w + bars_w + 0.3 + matrix_w + 0.12
    key = figure.colorbar(
        image, cax=figure.add_axes((left / width, bottom / height, 0.1 / width, panel_h / height))
    )
    key.set_ticks([-reach, 0.0, reach], labels=[number(-reach), "0", number(reach)])
    key.ax.tick_params(labelsize=7)
    figure.text(0.5, 1 - 0.08 / height, "\n".join(heading), ha="center", va="top", fontsize=9)
    figure.text(0.5, 0.06 / height, "\n".join(lines), ha="center", va="bottom", fontsize=7)
    return figure
