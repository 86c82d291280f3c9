"""A span attribution as one static HTML page: the context with its spans highlighted,
the answer's tokens to choose from, the top spans listed with their scores, and the
ablation check that says how far to trust the ranking, with its verdict in words
(explain.cite.verdict: the terminal and cite.json say the same).

The page is self-contained (no external script, style or font, nothing fetched): texts
are written into it as escaped HTML, and the span relevances are embedded as JSON arrays
(the values, and the values as explain.cite.verdict.number writes them) that a few
lines of inline script read when a choice is made. Choice 1 is the whole answer (each
span's score), choice g + 1 answer token g, and after the G tokens' choices one per
sentence of the answer (its statement: the span scores of that sentence's tokens,
explain.cite.statements), shown before the tokens; they are chosen by click, or by Tab
and Enter, and `page.html#c` opens on choice c (explain.viz.choice_script).
Colours are the diverging scale of explain.viz.text (red for, blue against), scaled per
choice by its largest |span relevance|; span text is black or white, whichever contrasts
more with its colour (WCAG AA). The top-spans list is rebuilt with `textContent`, so no
text of the context is ever read as markup.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from explain.cite.check import Check
from explain.cite.verdict import lds_band, number, random_sets
from explain.errors import InputError
from explain.viz.choice_script import choice_script
from explain.viz.shade_script import SHADE_SCRIPT
from explain.viz.text import colour

__all__ = ["CHOICE_STYLE", "PRESS_SCRIPT", "choice_button", "cite_html"]

TOP_LISTED = 5
"""The spans the page lists for the chosen answer token (or the whole answer)."""

PRESS_SCRIPT = """
function press(g) {
  document.querySelectorAll("span.choice").forEach(span => {
    const chosen = Number(span.dataset.g) === g;
    span.classList.toggle("chosen", chosen);
    span.setAttribute("aria-pressed", String(chosen));
  });
}
"""
"""The script part that marks choice `g`'s button pressed and every other one not."""

CHOICE_STYLE = """
span.choice { cursor: pointer; text-decoration: underline dotted; padding: 2px 3px;
  border-radius: 3px; white-space: pre-wrap; }
span.choice:focus-visible { outline: 3px solid #1a5fb4; outline-offset: 1px; }
span.chosen { outline: 2px solid black; }
"""
"""The look of the choices' buttons: dotted underlines, a focus ring, the chosen outlined."""

_SCRIPT = (
    SHADE_SCRIPT
    + PRESS_SCRIPT
    + """
const rows = JSON.parse(document.getElementById("relevance").textContent);
const shown = JSON.parse(document.getElementById("relevance-text").textContent);
const texts = JSON.parse(document.getElementById("span-texts").textContent);
const labels = JSON.parse(document.getElementById("choice-labels").textContent);
function choose(g) {
  const row = rows[g];
  const scale = Math.max(0, ...row.map(Math.abs));
  document.querySelectorAll("span.src").forEach(span => {
    const s = Number(span.dataset.s), rgb = shade(row[s], scale);
    span.style.backgroundColor = "rgb(" + rgb.join(", ") + ")";
    span.style.color = ink(rgb);
    span.title = "span " + (s + 1) + ": " + shown[g][s];
  });
  press(g);
  const order = row.map((v, s) => s).sort((a, b) => row[b] - row[a] || a - b);
  const list = document.getElementById("top");
  list.replaceChildren(...order.slice(0, TOP).map(s => {
    const item = document.createElement("li");
    item.textContent = shown[g][s] + "  (span " + (s + 1) + ")  " + texts[s].trim();
    return item;
  }));
  document.getElementById("status").textContent =
    "span relevance for " + labels[g] + " (address #" + (g + 1) + ")";
}
"""
)

_CHOICE = choice_script("span.choice", "rows")

_STYLE = (
    CHOICE_STYLE
    + """
body { font-family: sans-serif; max-width: 60em; margin: 2em auto; line-height: 1.8; }
span.src { padding: 1px 0; border-radius: 3px; white-space: pre-wrap; }
p.context { white-space: normal; border-left: 3px solid #ccc; padding-left: 1em; }
span.foil { color: #555; }
p.legend, p.note { color: #555; line-height: 1.4; }
p.verdict { line-height: 1.4; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: right; }
ol#top li { white-space: pre-wrap; }
"""
)


def _json(value: Any) -> str:
    # "<" escaped too: the JSON lives in a <script> element, which "</script>" would end.
    return json.dumps(value).replace("<", "\\u003c")


def choice_button(g: int, text: str, kind: str = "") -> str:
    """The button of choice `g` (from 0), showing `text` (escaped); `kind` more classes.
    A span with a button's role: reachable with Tab, chosen with Enter or Space."""
    return (
        f'<span class="choice{kind}" data-g="{g}" tabindex="0" role="button" '
        f'aria-pressed="false">{html.escape(text)}</span>'
    )


_ablated = {"spans": "shorter context", "regions": "filled photo"}


def _below_top_1(check: Check, sources: str) -> str:
    """One sentence where a top-k drop (k > 1) is below the top-1 drop, else ""."""
    lower = [d for d in check.drops[1:] if d.top < check.drops[0].top]
    if not lower:
        return ""
    drop = lower[0]
    return (
        f'<p class="note">The top-{drop.k} drop ({number(drop.top)}) is below the top-1 drop '
        f"({number(check.drops[0].top)}): removing the next {sources} as well raised "
        f"{html.escape(check.target)} again, so one of them speaks against the answer, or the "
        f"{_ablated.get(sources, 'ablated prompt')} moves the answer for "
        "reasons of its own.</p>\n"
    )


def _check_table(values: Mapping[str, Any], sources: str = "spans") -> str:
    """The check's verdict (explain.cite.verdict), its figures as a table, and what was
    ablated and the LDS, of the `sources` the check removed ("spans" of a context,
    "regions" of a photo)."""
    check = Check.from_dict(dict(values))
    said = check.verdict
    whole = {"spans": "context", "regions": "photo"}.get(sources, "photo and context")
    rows = "".join(
        f"<tr><td>{d.k}</td><td>{number(d.top)}</td><td>{number(d.random)} &plusmn; "
        f"{number(d.random_std)}</td><td>{random_sets(d)}</td>"
        f"<td>{'tied at the cut' if d.tied else ''}</td></tr>"
        for d in check.drops
    )
    if check.lds_ablations:
        value = "undefined (constant)" if check.lds is None else number(check.lds)
        lds_line = (
            f"LDS over {check.lds_ablations} random ablations of half the {sources} "
            f"(Spearman): {value} ({lds_band(check)})"
        )
    else:
        lds_line = "LDS: not computed (explain cite --lds N)"
    target = html.escape(check.target)
    return (
        f'<h3>How far to trust this ranking</h3>\n<p class="verdict">Verdict: '
        f"<b>{html.escape(said.word)}</b>: {html.escape(said.reason)}</p>\n"
        f'<p class="note">{target} with the whole {whole}: {number(check.full)}. Ablation: '
        f"{html.escape(check.ablation)}. Drop of {target} when the top-k {sources} are "
        "removed, against the mean (&plusmn; standard deviation) of its drop when any k "
        f"are: every set of k {sources} where there are at most {check.draws}, else "
        f"{check.draws} random sets of k {sources} (seed {check.seed}):</p>\n<table><tr>"
        "<th>k</th><th>top-k drop</th><th>random drop</th><th>over</th><th></th></tr>"
        f"{rows}</table>\n{_below_top_1(check, sources)}"
        f'<p class="note">{html.escape(lds_line)}</p>\n'
    )


def cite_html(
    spans: Sequence[str],
    question: str,
    answer_tokens: Sequence[str],
    span_relevance: Tensor,
    *,
    method: str,
    foil_tokens: int = 0,
    sentences: Sequence[str] = (),
    check: Mapping[str, Any] | None = None,
    title: str = "explain cite",
    note: str = "",
) -> str:
    """The page of one answer.

    Args:
        spans: the S spans' texts, in order (together, the context).
        question: the question asked.
        answer_tokens: the G answer tokens (the last `foil_tokens` of them a foil's).
        span_relevance: (G + 1 + N, S): row 0 each span's score for the whole answer, row
            g + 1 its relevance for answer token g, row G + 1 + n its score for sentence
            n of the answer (`Citation.statement_relevance`).
        sentences: the N sentences' texts (none: no sentence choices).
        method: the method that made the relevances, named in the heading.
        check: the ablation check as `Check.to_dict` gives it, or None.
        title: the heading reads "TITLE (METHOD)".
        note: what the scores are where not all are the method's (`Citation.ablated_note`),
            shown under the top spans.
    """
    count = len(answer_tokens)
    rows_wanted = (count + 1 + len(sentences), len(spans))
    if span_relevance.dim() != 2 or tuple(span_relevance.shape) != rows_wanted:
        raise InputError(
            f"span_relevance must be (answer tokens + 1 + sentences, spans) = {rows_wanted}, "
            f"got {tuple(span_relevance.shape)}"
        )
    if not 0 <= foil_tokens < count:
        raise InputError(f"{foil_tokens} foil tokens among {count} answer tokens")
    values = span_relevance.detach().cpu().double()
    if not bool(values.isfinite().all()):
        raise InputError("the span relevances hold NaN or infinite values; nothing is drawn")
    rows = [[round(float(v), 6) for v in row] for row in values]
    shown = [[number(float(v), signed=True) for v in row] for row in values]
    context = "".join(
        f'<span class="src" data-s="{s}">{html.escape(text)}</span>' for s, text in enumerate(spans)
    )
    answer_end = count - foil_tokens
    labels = (
        ["the whole answer"]
        + [
            f"{'foil' if g >= answer_end else 'answer'} token {g + 1}: {token}"
            for g, token in enumerate(answer_tokens)
        ]
        + [f"sentence {n + 1} of the answer: {text.strip()}" for n, text in enumerate(sentences)]
    )

    answer = " ".join(choice_button(g + 1, t) for g, t in enumerate(answer_tokens[:answer_end]))
    choices = choice_button(0, "whole answer")
    if sentences:
        said = " ".join(
            choice_button(count + 1 + n, text.strip(), " sentence")
            for n, text in enumerate(sentences)
        )
        choices += f" | by sentence: {said}"
    choices += f" | answer: {answer}"
    if foil_tokens:
        foil = " ".join(
            choice_button(answer_end + g + 1, t, " foil")
            for g, t in enumerate(answer_tokens[answer_end:])
        )
        choices += f" | foil (negated: why the answer rather than this): {foil}"
    which = (
        "the whole answer, one of its sentences or one of its tokens"
        if sentences
        else ("the whole answer or one of its tokens")
    )
    red, blue = colour(1.0, 1.0), colour(-1.0, 1.0)
    heading = html.escape(f"{title} ({method})")
    script = _SCRIPT.replace("TOP", str(TOP_LISTED))
    ablated = f'<p class="legend" id="ablated">{html.escape(note)}</p>\n' if note else ""
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{heading}</title><style>{_STYLE}</style></head>\n<body>\n"
        f"<h2>{heading}</h2>\n"
        f'<p class="legend">Choose {which} (click, or Tab and Enter): every span of the '
        "context is coloured by its relevance for it, "
        f'<span style="color: rgb{red}">red</span> for, '
        f'<span style="color: rgb{blue}">blue</span> against, scaled by the largest '
        "magnitude; the top spans are listed below. The address <code>#c</code> opens "
        "choice c (1: the whole answer).</p>\n"
        f'<p>{choices}</p>\n<p id="status"></p>\n'
        f'<p class="context">{context}</p>\n'
        f"<p><b>Question:</b> {html.escape(question)}</p>\n"
        f'<h3>Top spans</h3>\n<ol id="top"></ol>\n'
        f"{ablated}"
        f"{_check_table(check) if check is not None else ''}"
        f'<script type="application/json" id="relevance">{_json(rows)}</script>\n'
        f'<script type="application/json" id="relevance-text">{_json(shown)}</script>\n'
        f'<script type="application/json" id="span-texts">{_json(list(spans))}</script>\n'
        f'<script type="application/json" id="choice-labels">{_json(labels)}</script>\n'
        f"<script>{script}{_CHOICE}</script>\n"
        "</body></html>\n"
    )
