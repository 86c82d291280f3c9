"""A generated continuation as one static HTML page: choose a generated token, and every
token before it is highlighted by its relevance for that token.

The page is self-contained (no external script, style or font, nothing fetched): the
tokens are written into it as escaped HTML, and the relevance rows are embedded as a
JSON array of numbers that a few lines of inline script read when a token is chosen.
Colours are the diverging scale of explain.viz.text (red for, blue against), scaled per
chosen token by the largest magnitude among the tokens before it, the token the
prediction is read out at excluded: its own relevance (the identity term of the rules)
would otherwise swamp every other token's; it is drawn hatched grey, off the scale. The
status line names the tokens the chosen one rests on most, by |relevance|, with their
positions and signed values, the readout token left out (explain.viz.ranking, as the
terminal and the figure's numbered cells give them). Token text is black
or white, whichever contrasts more with its colour (WCAG AA). Generated
tokens are chosen by click, or by Tab and Enter; the page opens on generated token 1, or
on token g (counted from 1, as the status line counts) of the address `page.html#g`,
which choosing a token updates.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence

from torch import Tensor

from explain.errors import InputError
from explain.viz.choice_script import choice_script
from explain.viz.ranking import sources_text
from explain.viz.shade_script import SHADE_SCRIPT
from explain.viz.text import colour

__all__ = ["generation_html"]

_SCRIPT = (
    SHADE_SCRIPT
    + """
const rows = JSON.parse(document.getElementById("relevance").textContent);
function choose(g) {
  const row = rows[g], prompt = PROMPT, at = prompt + g;
  let scale = 0;
  for (let t = 0; t < at - 1; t++) scale = Math.max(scale, Math.abs(row[t]));
  document.querySelectorAll("span.tok").forEach(span => {
    const t = Number(span.dataset.t), coloured = t < at - 1;
    span.classList.toggle("chosen", t === at);
    span.classList.toggle("readout", t === at - 1);
    const rgb = coloured ? shade(row[t], scale) : null;
    span.style.backgroundColor = rgb ? "rgb(" + rgb.join(", ") + ")" : "";
    span.style.color = rgb ? ink(rgb) : "";
    const off = coloured ? "" : " (readout token, off the scale)";
    span.title = t < at ? row[t].toPrecision(4) + off : "";
    if (span.dataset.g !== undefined) span.setAttribute("aria-pressed", String(t === at));
  });
  const chosen = document.querySelector('span.gen[data-g="' + g + '"]');
  document.getElementById("status").textContent =
    "relevance for generated token " + (g + 1) + " of " + rows.length +
    " (address #" + (g + 1) + "): " + chosen.textContent + " rests most on " +
    chosen.dataset.rests;
}
"""
)

_CHOICE = choice_script("span.gen", "rows")

_STYLE = """
body { font-family: sans-serif; max-width: 60em; margin: 2em auto; line-height: 2.2; }
span.tok { padding: 2px 3px; border-radius: 3px; white-space: pre-wrap; }
span.gen { cursor: pointer; text-decoration: underline dotted; }
span.gen:focus-visible { outline: 3px solid #1a5fb4; outline-offset: 1px; }
span.chosen { outline: 2px solid black; }
span.readout { background: repeating-linear-gradient(45deg, #ddd 0 4px, #fff 4px 8px);
  box-shadow: inset 0 -3px 0 #555; }
p.legend { color: #555; line-height: 1.4; }
"""


def generation_html(
    tokens: Sequence[str],
    prompt_length: int,
    relevance: Tensor,
    *,
    method: str,
    rests_on: Sequence[Sequence[int]],
    title: str = "explain generate",
) -> str:
    """The page for one sequence: `tokens` (T) of prompt + continuation, the first
    `prompt_length` of them the prompt, and `relevance` (G, T), row g for the token at
    `prompt_length + g` (rows past the continuation's end are left out by the caller).
    `rests_on[g]`: the positions generated token g rests on most, most relevant first
    (`Answer.rests_on`), written with their values as the terminal writes them
    (explain.viz.ranking.sources_text). The heading reads "TITLE (METHOD)", `method`
    being the one that made `relevance`."""
    count = relevance.shape[0]
    if relevance.dim() != 2 or relevance.shape[1] != len(tokens):
        raise InputError(
            f"relevance must be (generated, tokens) with {len(tokens)} tokens, "
            f"got {tuple(relevance.shape)}"
        )
    if not 0 < prompt_length <= len(tokens) - count:
        raise InputError(
            f"{count} generated tokens after a prompt of {prompt_length} do not fit in "
            f"{len(tokens)} tokens"
        )
    if len(rests_on) != count:
        raise InputError(f"{count} generated tokens but {len(rests_on)} rests_on lists")
    rows = [[round(float(v), 6) for v in row] for row in relevance.detach().cpu().double()]
    # "<" escaped too: the JSON lives in a <script> element, which "</script>" would end.
    data = json.dumps(rows).replace("<", "\\u003c")
    spans = []
    for index, token in enumerate(tokens[: prompt_length + count]):
        generated = index >= prompt_length
        # Generated tokens are buttons: reachable with Tab, chosen with Enter or Space.
        attributes = ""
        if generated:
            g = index - prompt_length
            sources = sources_text(tokens, relevance[g], rests_on[g])
            attributes = (
                f' data-g="{g}" tabindex="0" role="button" aria-pressed="false"'
                f' data-rests="{html.escape(sources)}"'
            )
        kind = "tok gen" if generated else "tok"
        spans.append(
            f'<span class="{kind}" data-t="{index}"{attributes}>{html.escape(token)}</span>'
        )
    prompt_end = '<br><span style="color: #555">continuation:</span> '
    body = " ".join(spans[:prompt_length]) + prompt_end + " ".join(spans[prompt_length:])
    red, blue = colour(1.0, 1.0), colour(-1.0, 1.0)
    heading = html.escape(f"{title} ({method})")
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{heading}</title><style>{_STYLE}</style></head>\n<body>\n"
        f"<h2>{heading}</h2>\n"
        '<p class="legend">Click a generated (underlined) token, or reach it with Tab and '
        "press Enter: every token before it is coloured by its relevance for it, "
        f'<span style="color: rgb{red}">red</span> for, '
        f'<span style="color: rgb{blue}">blue</span> against, scaled by the largest '
        "magnitude before it without the token the prediction is read out at (hatched grey, "
        "off the scale: its own identity term would swamp the rest). The address "
        '<code>#g</code> opens generated token g (from 1).</p>\n<p id="status"></p>\n'
        f"<p>{body}</p>\n"
        f'<script type="application/json" id="relevance">{data}</script>\n'
        f"<script>{_SCRIPT.replace('PROMPT', str(prompt_length))}{_CHOICE}</script>\n"
        "</body></html>\n"
    )
