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

__all__ = ["colour", "document_html", "note_html", "printable", "to_html", "to_terminal"]

_RED = (178, 24, 43)
_BLUE = (33, 102, 172)


def printable(text: str) -> str:
    """`text` safe to print to a terminal: every control or other non-printable character
    (escape sequences that would move the cursor, recolour or retitle the terminal) is
    shown as its Python escape, e.g. `\\x1b`, instead of acting."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


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
    the tooltip and in a label that `document_html`'s "show values" switch reveals.
    `scores` may be longer than `tokens` (padding); extra values are ignored. A text whose
    relevance is zero everywhere says so."""
    shown, scale = _shown(tokens, scores, skip)
    spans = []
    for token, value in shown:
        red, green, blue = colour(value, scale)
        kind = "tok neg" if value < 0 else "tok"
        spans.append(
            f'<span class="{kind}" style="background-color: rgb({red}, {green}, {blue})" '
            f'title="{value:.4g}" data-v="{value:+.3g}">{html.escape(token)}</span>'
        )
    heading = f"<h3>{html.escape(title)}</h3>\n" if title is not None else ""
    note = (
        ' <em class="note">(every relevance is 0: nothing to highlight)</em>' if scale == 0 else ""
    )
    return f'{heading}<p class="text">{" ".join(spans)}{note}</p>'


_STYLE = """<style>
body { font-family: sans-serif; }
.text { line-height: 2.2; }
.tok { padding: 0 2px; border-radius: 3px; }
#values:checked ~ main .tok::after { content: " " attr(data-v); font-size: 70%; color: #333; }
.swatch { display: inline-block; width: 1.2em; height: 1em; vertical-align: middle;
  border: 1px solid #ccc; }
</style>"""


def _legend(body: str) -> str:
    """The colours the page actually uses, and how they were scaled."""
    parts = [
        f'<span class="swatch" style="background: rgb{_RED}"></span> evidence for the '
        "explained output",
        '<span class="swatch" style="background: rgb(255, 255, 255)"></span> none',
    ]
    if "tok neg" in body:
        parts.append(
            f'<span class="swatch" style="background: rgb{_BLUE}"></span> evidence against'
        )
    else:
        parts.append("(no token has negative relevance here, so no blue)")
    return (
        '<p style="color: #555">Colours: ' + ", ".join(parts) + "; each text is scaled by its "
        "largest |relevance|, so colours compare tokens within a text, not across texts.</p>"
    )


def note_html(note: str) -> str:
    """A note (escaped) as an HTML fragment, e.g. that a method's values do not conserve
    relevance and are shown normalised."""
    return f"<p><b>Note:</b> {html.escape(note)}</p>"


def document_html(
    fragments: Sequence[str], title: str = "explain: text relevance", note: str | None = None
) -> str:
    """A complete HTML page around fragments made by `to_html`, with a legend of the
    colours it uses and a "show values" switch that writes each token's score after it;
    `note` (escaped) heads the page, e.g. that a method's values do not conserve relevance."""
    body = "\n".join(fragments if note is None else [note_html(note), *fragments])
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title>\n{_STYLE}</head>\n<body>\n"
        f"{_legend(body)}\n"
        '<input type="checkbox" id="values"><label for="values"> show values</label>\n'
        f"<main>\n{body}\n</main>\n</body></html>\n"
    )


def to_terminal(
    tokens: Sequence[str], scores: Tensor | Sequence[float], *, skip: Collection[str] = ()
) -> str:
    """One text with 24-bit ANSI background colours, for terminals that support them.
    A text whose relevance is zero everywhere says so."""
    shown, scale = _shown(tokens, scores, skip)
    pieces = []
    for token, value in shown:
        red, green, blue = colour(value, scale)
        shown_token = printable(token)  # only our own escape sequences act
        pieces.append(f"\x1b[48;2;{red};{green};{blue}m\x1b[38;2;0;0;0m{shown_token}\x1b[0m")
    return " ".join(pieces) + ("  (every relevance is 0)" if scale == 0 else "")
