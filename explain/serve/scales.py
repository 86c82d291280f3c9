"""How one view of the page turns relevance into colour: each map on its own scale, or one
shared scale per kind of map, with the colour keys and the caption that say which.

"per_map" is the figures' rule (explain.viz.scaling). "shared" keeps the unsigned maps
(generic, rollout, ...: non-negative) and the signed maps (AttnLRP, CP-LRP, full LRP)
on two scales, 0 to the largest unsigned value and -M to M over the largest signed
magnitude, each with its own key. One red-blue scale for both would draw the unsigned
maps, whose values are often a hundred times smaller, almost white: a method that found
something would look as if it found nothing. Where a view holds both kinds, the signed
panels are marked ±, as the keys say.
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
    own = scale_maps(maps, "per_map")
    both = len(set(own.signed)) > 1
    marked = [signed and both for signed in own.signed]
    if rule == "per_map":
        kinds = own.keys()  # False: the sequential key, True: the diverging one
        keys = [_key(own, signed, own.key_label(signed)) for signed in kinds]
        return ViewScale(own.maps, own.notes, own.signed, marked, keys, own.caption())
    display: list[np.ndarray] = [np.empty(0)] * len(maps)
    groups = {}
    for kind in sorted(set(own.signed)):  # unsigned first: its key comes first
        members = [i for i, signed in enumerate(own.signed) if signed == kind]
        group = scale_maps([maps[i] for i in members], "shared")
        for position, i in enumerate(members):
            display[i] = group.maps[position]
        groups[kind] = group
    if not both:
        ((kind, group),) = groups.items()
        keys = [_key(group, kind, group.key_label(kind))]
        return ViewScale(display, own.notes, own.signed, marked, keys, group.caption())
    unsigned, signed = groups[False], groups[True]
    keys = [
        _key(unsigned, False, "unsigned maps (one shared scale)"),
        _key(signed, True, "signed maps, marked ± (one shared scale)"),
    ]
    caption = (
        f"One shared scale per kind of map: unsigned maps 0 to {unsigned.peak:.3g}, signed "
        f"maps (marked ±) -{signed.peak:.3g} to {signed.peak:.3g} (red for, blue against), "
        "each with its key; opacity follows |relevance|."
    )
    return ViewScale(display, own.notes, own.signed, marked, keys, caption)


def _key(scale: FigureScale, signed: bool, title: str) -> dict[str, Any]:
    """One colour key, its ends labelled as explain.viz labels its figures' keys."""
    _, labels = scale.key_ticks(signed)
    return {"signed": signed, "labels": labels, "title": title}
