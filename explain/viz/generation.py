"""A generated continuation as one static HTML page: choose a generated token, and every
token before it is highlighted by its relevance for that token.

The page is self-contained (no external script, style or font, nothing fetched): the
tokens are written into it as escaped HTML, and the relevance rows are embedded as a
JSON array of numbers that a few lines of inline script read when a token is chosen.
Colours are the diverging scale of explain.viz.text (red for, blue against), scaled per
chosen token by the largest magnitude among the tokens before it, the token the
prediction is read out at excluded: its own relevance (the identity term of the rules)
would otherwise swamp every other token's; it is drawn at full colour with a frame.
The page opens on the first generated token, or on token g of the address `page.html#g`.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence

from torch import Tensor

from explain.errors import InputError
from explain.viz.text import colour

__all__ = ["generation_html"]

_SCRIPT = """
const rows = JSON.parse(document.getElementById("relevance").textContent);
const red = [178, 24, 43], blue = [33, 102, 172];
function shade(value, scale) {
  const s = scale > 0 ? Math.max(-1, Math.min(1, value / scale)) : 0;
  const end = s >= 0 ? red : blue, w = Math.abs(s);
  return "rgb(" + end.map(c => Math.round(255 + (c - 255) * w)).join(", ") + ")";
}
function choose(g) {
  const row = rows[g], prompt = PROMPT, at = prompt + g;
  let scale = 0;
  for (let t = 0; t < at - 1; t++) scale = Math.max(scale, Math.abs(row[t]));
  document.querySelectorAll("span.tok").forEach(span => {
    const t = Number(span.dataset.t);
    span.classList.toggle("chosen", t === at);
    span.classList.toggle("readout", t === at - 1);
    span.style.backgroundColor = t < at ? shade(row[t], scale) : "transparent";
    span.style.color = t < at && scale > 0 && Math.abs(row[t]) > 0.6 * scale ? "white" : "";
    span.title = t < at ? row[t].toPrecision(4) : "";
  });
  document.getElementById("status").textContent =
    "relevance for generated token " + (g + 1) + " of " + rows.length;
}
document.querySelectorAll("span.gen").forEach(span =>
  span.addEventListener("click", () => choose(Number(span.dataset.g))));
// The page opens on the first generated token, or on the one its address names (#g).
const opened = Math.max(0, Math.min(rows.length - 1, Number(location.hash.slice(1)) || 0));
if (rows.length) choose(opened);
"""

_STYLE = """
body { font-family: sans-serif; max-width: 60em; margin: 2em auto; line-height: 2.2; }
span.tok { padding: 2px 3px; border-radius: 3px; white-space: pre-wrap; }
span.gen { cursor: pointer; text-decoration: underline dotted; }
span.chosen { outline: 2px solid black; }
span.readout { box-shadow: inset 0 -3px 0 #555; }
p.legend { color: #555; line-height: 1.4; }
"""


def generation_html(
    tokens: Sequence[str],
    prompt_length: int,
    relevance: Tensor,
    *,
    title: str = "explain generate",
) -> str:
    """The page for one sequence: `tokens` (T) of prompt + continuation, the first
    `prompt_length` of them the prompt, and `relevance` (G, T), row g for the token at
    `prompt_length + g` (rows past the continuation's end are left out by the caller)."""
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
    rows = [[round(float(v), 6) for v in row] for row in relevance.detach().cpu().double()]
    # "<" escaped too: the JSON lives in a <script> element, which "</script>" would end.
    data = json.dumps(rows).replace("<", "\\u003c")
    spans = []
    for index, token in enumerate(tokens[: prompt_length + count]):
        generated = index >= prompt_length
        attributes = f' data-g="{index - prompt_length}"' if generated else ""
        kind = "tok gen" if generated else "tok"
        spans.append(
            f'<span class="{kind}" data-t="{index}"{attributes}>{html.escape(token)}</span>'
        )
    prompt_end = '<br><span style="color: #555">continuation:</span> '
    body = " ".join(spans[:prompt_length]) + prompt_end + " ".join(spans[prompt_length:])
    red, blue = colour(1.0, 1.0), colour(-1.0, 1.0)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>\n<body>\n"
        f"<h2>{html.escape(title)}</h2>\n"
        '<p class="legend">Click a generated (underlined) token: every token before it is '
        f'coloured by its relevance for it, <span style="color: rgb{red}">red</span> for, '
        f'<span style="color: rgb{blue}">blue</span> against, scaled by the largest '
        "magnitude before it without the token the prediction is read out at (underlined "
        'in grey, drawn at full colour).</p>\n<p id="status"></p>\n'
        f"<p>{body}</p>\n"
        f'<script type="application/json" id="relevance">{data}</script>\n'
        f"<script>{_SCRIPT.replace('PROMPT', str(prompt_length))}</script>\n"
        "</body></html>\n"
    )
