"""The inline script by which a static page colours its text: the diverging red-blue
scale of explain.viz.text (`shade(value, scale)`, red for, blue against, full colour at
|value| = scale) and the text colour, black or white, whichever contrasts more with it
(`ink(rgb)`, WCAG 2, at least 4.58:1). The generation and span attribution pages share it."""

from __future__ import annotations

__all__ = ["SHADE_SCRIPT"]

SHADE_SCRIPT = """
const red = [178, 24, 43], blue = [33, 102, 172];
function shade(value, scale) {
  const s = scale > 0 ? Math.max(-1, Math.min(1, value / scale)) : 0;
  const end = s >= 0 ? red : blue, w = Math.abs(s);
  return end.map(c => Math.round(255 + (c - 255) * w));
}
// WCAG 2 relative luminance; black or white text, whichever contrasts more (>= 4.58:1).
function luminance(rgb) {
  const l = rgb.map(c => c / 255).map(c => c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4);
  return 0.2126 * l[0] + 0.7152 * l[1] + 0.0722 * l[2];
}
function ink(rgb) {
  const y = luminance(rgb);
  return (y + 0.05) / 0.05 >= 1.05 / (y + 0.05) ? "black" : "white";
}
"""
