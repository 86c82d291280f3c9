"""How one view of the page turns relevance into colour: each map on its own scale, or one
shared scale per kind of map, with the colour keys and the caption that say which.

The rules are the figures' (explain.viz.scaling), so a page and a PNG of the same maps
say the same: "per_map", or "shared", which keeps the unsigned maps and the signed maps
on two scales, each with its own key, never one red-blue scale for both. Where a view
holds both kinds, the signed panels are marked ±, as the keys say.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from explain.errors import InputError
from explain.viz.scaling import RULES, FigureScale, scale_maps

__all__ = ["ViewScale", "check_rule", "scale_view"]


@dataclass(frozen=True)
class ViewScale:
    """The maps of one view in display units, and what the view must say about them.

    Attributes:
        maps: per map, its values in [0, 1] (unsigned) or [-1, 1] (signed).
        notes: per map, "all-zero map", "constant map" or None.
        signed: per map, whether it is drawn on the diverging (red-blue) scale.
        marked: per map, whether its panel carries the ± mark (a signed map in a view
            that also holds unsigned ones).
        keys: the colour keys, each {"signed", "labels" (its ends, and 0 for signed
            keys), "title"}.
        caption: one line that states the rule.
    """

    maps: list[np.ndarray]
    notes: list[str | None]
    signed: list[bool]
    marked: list[bool]
    keys: list[dict[str, Any]]
    caption: str

    def map_json(self, raw: np.ndarray, position: int) -> dict[str, Any]:
        """Map `position` for the page: its raw values (read on hover), display values
        (colour), which scale it is on, its ± mark and its note."""
        return {
            "values": raw.tolist(),
            "display": self.maps[position].tolist(),
            "signed": self.signed[position],
            "marked": self.marked[position],
            "note": self.notes[position],
        }


def check_rule(rule: str) -> None:
    """InputError unless `rule` is one of explain.viz.scaling's RULES."""
    if rule not in RULES:
        raise InputError(f"unknown normalisation {rule!r}; use one of {', '.join(RULES)}")


def scale_view(maps: Sequence[np.ndarray], rule: str = "per_map") -> ViewScale:
    """Scale the raw maps of one view (at least one) by `rule` ("per_map" or "shared",
    see above)."""
    check_rule(rule)
    scaled = scale_maps(maps, rule)
    kinds = scaled.keys()  # False: the sequential key, True: the diverging one
    marked = [signed and len(kinds) > 1 for signed in scaled.signed]
    keys = [_key(scaled, signed, scaled.key_label(signed)) for signed in kinds]
    return ViewScale(scaled.maps, scaled.notes, scaled.signed, marked, keys, scaled.caption())


def _key(scale: FigureScale, signed: bool, title: str) -> dict[str, Any]:
    """One colour key, its ends labelled as explain.viz labels its figures' keys."""
    _, labels = scale.key_ticks(signed)
    return {"signed": signed, "labels": labels, "title": title}
