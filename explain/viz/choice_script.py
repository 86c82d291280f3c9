"""The inline script by which a static page's items are chosen: by click, or by Tab and
Enter (or Space), with the choice kept in the page's address.

The generation and vision-language answer pages share it: each defines `choose(g)`, which
shows item g, and a JavaScript array of its items; this part wires the item spans to it,
writes `#g` (counted from 1, as the pages' status lines count) into the address on each
choice, and opens the page on the item that address names, or on the first.
"""

from __future__ import annotations

__all__ = ["choice_script"]


def choice_script(spans: str, items: str) -> str:
    """The script that makes each span of CSS selector `spans` (its `data-g` its item's
    index) choose that item, and opens on the address's item; `items` names the page's
    array of items, and the page's own script must define `choose(g)` before it."""
    return f"""
function select(g) {{
  choose(g);
  history.replaceState(null, "", "#" + (g + 1));
}}
document.querySelectorAll("{spans}").forEach(span => {{
  const g = Number(span.dataset.g);
  span.addEventListener("click", () => select(g));
  span.addEventListener("keydown", event => {{
    if (event.key === "Enter" || event.key === " ") {{ event.preventDefault(); select(g); }}
  }});
}});
// The page opens on item 1, or on the one its address names (#g, from 1).
const asked = Number(location.hash.slice(1)) || 1;
if ({items}.length) choose(Math.max(0, Math.min({items}.length - 1, asked - 1)));
"""
