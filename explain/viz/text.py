"""Highlighted text as HTML and as ANSI-coloured terminal output (figures: text_figure.py).

Each token gets a background on a diverging scale centred at zero, the same as the
figures: red for evidence for the explained class, blue against, white for none, scaled
per text by its largest magnitude. Every token is HTML-escaped: a text that contains
`<script>` shows those characters and runs nothing. Tokens listed in `skip` (the
tokenizer's special tokens: [CLS], [SEP], padding) are neither shown nor used for the
scale, since their relevance (the readout token's own) would swamp the words'.
"""

from __future__ import annotations

import html
import math
from collections.abc import Collection, Sequence

from torch import Tensor

from explain.errors import InputError

__all__ = ["colour", "document_html", "to_html", "to_terminal"]

_RED = (178, 24, 43)
_BLUE = (33, 102, 172)


def colour(score: float, scale: float) -> tuple[int, int, int]:
    """RGB of `score` on the diverging white-centred scale reaching full colour at `scale`."""
    strength = 0.0 if scale <= 0 else max(-1.0, min(1.0, score / scale))
    end = _RED if strength >= 0 else _BLUE
    weight = abs(strength)
    return tuple(round(255 + (channel - 255) * weight) for channel in end)  # type: ignore[return-value]


def _shown(
    tokens: Sequence[str], scores: Tensor | Sequence[float], skip: Collection[str]
) -> tuple[list[tuple[str, float]], float]:
    values = [float(v) for v in scores]
    if not all(math.isfinite(value) for value in values):  # no colour means NaN
        raise InputError("the scores hold NaN or infinite values; they cannot be drawn")
    if len(values) < len(tokens):
        raise InputError(f"{len(tokens)} tokens but only {len(values)} scores")
    pairs = zip(tokens, values[: len(tokens)], strict=True)
    shown = [(token, value) for token, value in pairs if token not in skip]
    scale = max((abs(value) for _, value in shown), default=0.0)
    return shown, scale


def to_html(
    tokens: Sequence[str],
    scores: Tensor | Sequence[float],
    *,
    skip: Collection[str] = (),
    title: str | None = None,
) -> str:
    """One text as an HTML fragment: a <p> of <span>s, each token escaped, its score in
    the tooltip. `scores` may be longer than `tokens` (padding); extra values are ignored."""
    shown, scale = _shown(tokens, scores, skip)
    spans = []
    for token, value in shown:
        red, green, blue = colour(value, scale)
        spans.append(
            f'<span style="background-color: rgb({red}, {green}, {blue}); padding: 0 2px; '
            f'border-radius: 3px" title="{value:.4g}">{html.escape(token)}</span>'
        )
    heading = f"<h3>{html.escape(title)}</h3>\n" if title is not None else ""
    return f'{heading}<p style="line-height: 1.8; font-family: sans-serif">{" ".join(spans)}</p>'


def document_html(fragments: Sequence[str], title: str = "explain: text relevance") -> str:
    """A complete HTML page around fragments made by `to_html`."""
    body = "\n".join(fragments)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title></head>\n<body>\n{body}\n"
        '<p style="font-family: sans-serif; color: #555">red: evidence for the explained '
        "output, blue: against; each text scaled by its largest magnitude</p>\n</body></html>\n"
    )


def to_terminal(
    tokens: Sequence[str], scores: Tensor | Sequence[float], *, skip: Collection[str] = ()
) -> str:
    """One text with 24-bit ANSI background colours, for terminals that support them."""
    shown, scale = _shown(tokens, scores, skip)
    pieces = []
    for token, value in shown:
        red, green, blue = colour(value, scale)
        printable = "".join(ch if ch.isprintable() else "?" for ch in token)  # no escapes
        pieces.append(f"\x1b[48;2;{red};{green};{blue}m\x1b[38;2;0;0;0m{printable}\x1b[0m")
    return " ".join(pieces)
