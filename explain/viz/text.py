"""Highlighted text as HTML and as ANSI-coloured terminal output (figures: text_figure.py).

Each token gets a background on a diverging scale centred at zero, the same as the
figures: red for evidence for the explained class, blue against, white for none, scaled
per text by its largest magnitude. Every token is HTML-escaped: a text that contains
`<script>` shows those characters and runs nothing. Tokens listed in `skip` (the
tokenizer's special tokens: [CLS], [SEP], padding) are neither shown nor used for the
scale, since their relevance (the readout token's own) would swamp the words'. A
language model's readout token (`readout=`: where its next token is read out) is shown,
hatched grey on the page and grey underlined in the terminal, but off the scale for the
same reason, as `explain generate` draws it.
"""

from __future__ import annotations

import html
import math
from collections.abc import Collection, Sequence

from torch import Tensor

from explain.errors import InputError

__all__ = [
    "colour",
    "contrast_ratio",
    "document_html",
    "note_html",
    "printable",
    "text_colour",
    "to_html",
    "to_terminal",
]

_RED = (178, 24, 43)
_BLUE = (33, 102, 172)
_READOUT_GREY = (204, 204, 204)
"""The terminal's readout token: grey and underlined, off the diverging scale."""


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


def _luminance(rgb: tuple[int, int, int]) -> float:
    """WCAG 2 relative luminance of an sRGB colour (0..255 channels)."""
    linear = [c / 255 / 12.92 if c <= 10 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast_ratio(foreground: tuple[int, int, int], background: tuple[int, int, int]) -> float:
    """WCAG 2 contrast ratio of two sRGB colours, from 1 (none) to 21 (black on white)."""
    lighter, darker = sorted((_luminance(foreground), _luminance(background)), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


def text_colour(background: tuple[int, int, int]) -> tuple[int, int, int]:
    """Black or white, whichever contrasts more with `background`: at least 4.58:1 for
    every background, above WCAG AA's 4.5:1 for normal text."""
    black, white = (0, 0, 0), (255, 255, 255)
    better = contrast_ratio(black, background) >= contrast_ratio(white, background)
    return black if better else white


def _shown(
    tokens: Sequence[str],
    scores: Tensor | Sequence[float],
    skip: Collection[str],
    readout: int | None,
) -> tuple[list[tuple[str, float, bool]], float]:
    """(token, value, whether it is the readout token) of each shown token, and the scale:
    the largest |value| among them, the readout token's left out."""
    values = [float(v) for v in scores]
    if not all(math.isfinite(value) for value in values):  # no colour means NaN
        raise InputError("the scores hold NaN or infinite values; they cannot be drawn")
    if len(values) < len(tokens):
        raise InputError(f"{len(tokens)} tokens but only {len(values)} scores")
    if readout is not None and not 0 <= readout < len(tokens):
        raise InputError(f"the readout token {readout} is not one of the {len(tokens)} tokens")
    shown = [
        (token, value, t == readout)
        for t, (token, value) in enumerate(zip(tokens, values[: len(tokens)], strict=True))
        if token not in skip
    ]
    scale = max((abs(value) for _, value, off in shown if not off), default=0.0)
    return shown, scale


def to_html(
    tokens: Sequence[str],
    scores: Tensor | Sequence[float],
    *,
    skip: Collection[str] = (),
    title: str | None = None,
    readout: int | None = None,
    sources: str | None = None,
) -> str:
    """One text as an HTML fragment: a <p> of <span>s, each token escaped, its score in
    the tooltip and in a label that `document_html`'s "show values" switch reveals.
    `scores` may be longer than `tokens` (padding); extra values are ignored. A text whose
    relevance is zero everywhere says so. `readout`: the index in `tokens` a language
    model's prediction is read out at, hatched grey and off the scale, as on
    `explain generate`'s page; `sources`: what the prediction rests on most
    (explain.viz.ranking.sources_text), written under the text."""
    shown, scale = _shown(tokens, scores, skip, readout)
    spans = []
    for token, value, off in shown:
        if off:
            spans.append(
                f'<span class="tok readout" title="{value:.4g} (the token the prediction is '
                f'read out at: its own identity term, off the scale)" data-v="{value:+.3g}">'
                f"{html.escape(token)}</span>"
            )
            continue
        background = colour(value, scale)
        kind = "tok neg" if value < 0 else "tok"
        spans.append(
            f'<span class="{kind}" style="background-color: rgb{background}; '
            f'color: rgb{text_colour(background)}" '
            f'title="{value:.4g}" data-v="{value:+.3g}">{html.escape(token)}</span>'
        )
    heading = f"<h3>{html.escape(title)}</h3>\n" if title is not None else ""
    note = (
        ' <em class="note">(every relevance is 0: nothing to highlight)</em>' if scale == 0 else ""
    )
    rests = f'\n<p class="rests">rests most on: {html.escape(sources)}</p>' if sources else ""
    return f'{heading}<p class="text">{" ".join(spans)}{note}</p>{rests}'


_STYLE = """<style>
body { font-family: sans-serif; }
.text { line-height: 2.2; }
.tok { padding: 0 2px; border-radius: 3px; }
.tok.readout { background: repeating-linear-gradient(45deg, #ddd 0 4px, #fff 4px 8px);
  box-shadow: inset 0 -3px 0 #555; }
#values:checked ~ main .tok::after { content: " " attr(data-v); font-size: 70%; }
.legend { color: #555; }
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
    against = f'<span class="swatch" style="background: rgb{_BLUE}"></span> evidence against'
    absent = "" if "tok neg" in body else " No token has negative relevance here, so no blue."
    if not absent:
        parts.append(against)
    if "tok readout" in body:
        parts.append(
            '<span class="swatch tok readout"></span> the token the prediction is read out '
            "at (its own identity term would swamp the rest: off the scale)"
        )
    return (
        '<p class="legend">Colours: ' + ", ".join(parts) + ". Each text is scaled by its "
        f"largest |relevance|, so colours compare tokens within a text, not across texts.{absent}"
        "</p>"
    )


def note_html(note: str) -> str:
    """A note (escaped) as an HTML fragment, e.g. that a method's values do not conserve
    relevance and are shown normalised."""
    return f"<p><b>Note:</b> {html.escape(note)}</p>"


def document_html(
    fragments: Sequence[str], title: str = "explain: text relevance", note: str | None = None
) -> str:
    """A complete HTML page around fragments made by `to_html`: `title` (escaped) as its
    heading, which should name the model and the method that made the page, a legend of
    the colours it uses and a "show values" switch that writes each token's score after
    it; `note` (escaped) follows the legend, e.g. that a method's values do not conserve
    relevance."""
    body = "\n".join(fragments if note is None else [note_html(note), *fragments])
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title>\n{_STYLE}</head>\n<body>\n"
        f"<h2>{html.escape(title)}</h2>\n{_legend(body)}\n"
        '<input type="checkbox" id="values"><label for="values"> show values</label>\n'
        f"<main>\n{body}\n</main>\n</body></html>\n"
    )


def to_terminal(
    tokens: Sequence[str],
    scores: Tensor | Sequence[float],
    *,
    skip: Collection[str] = (),
    readout: int | None = None,
) -> str:
    """One text with 24-bit ANSI background colours, for terminals that support them.
    A text whose relevance is zero everywhere says so. `readout`: the index in `tokens`
    a language model's prediction is read out at, grey, underlined and off the scale."""
    shown, scale = _shown(tokens, scores, skip, readout)
    pieces = []
    for token, value, off in shown:
        red, green, blue = _READOUT_GREY if off else colour(value, scale)
        ink = ";".join(map(str, text_colour((red, green, blue))))
        shown_token = printable(token)  # only our own escape sequences act
        underline = "\x1b[4m" if off else ""
        pieces.append(
            f"\x1b[48;2;{red};{green};{blue}m\x1b[38;2;{ink}m{underline}{shown_token}\x1b[0m"
        )
    return " ".join(pieces) + ("  (every relevance is 0)" if scale == 0 else "")
