"""How a figure turns relevance into colour: one rule per figure, stated on the figure.

Relevance has no common unit across methods, so a figure says how its colours were made:

- `"per_map"` (the default): each map is scaled on its own: min-max to [0, 1] on a
  perceptually uniform sequential colormap, or, for a *signed* map (one with negative
  values, e.g. full LRP's pixel relevance), divided by the 99th percentile of its
  magnitudes and clipped to [-1, 1] on a diverging colormap centred at zero, so that
  evidence against the class is never shown as "little evidence for". The percentile
  rather than the maximum because pixel relevance is heavy-tailed: a handful of extreme
  pixels would otherwise leave the rest of the map invisibly faint. Colours compare places
  within a map, never maps with each other, so such a figure has a colour key (a map's
  own ends) but no value bar.
- `"shared"`: one scale per kind of map, with a colour bar in relevance units each: the
  unsigned maps (generic, rollout, ...: non-negative) from 0 to the largest of them, the
  signed maps (AttnLRP, CP-LRP, full LRP) from -M to M over the largest magnitude among
  them, diverging. Colours compare maps of a kind too: a weak map looks weak. Never one
  red-blue scale for both kinds: the unsigned maps, whose values are often a hundred
  times smaller, would be drawn almost white, and a method that found something would
  look as if it found nothing. Where a figure holds both kinds, the signed panels are
  marked ±, as their key says.

All-zero and constant maps carry no information about places; they are drawn without
colour and labelled as such.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from explain.errors import InputError

__all__ = ["RULES", "SIGNED_PERCENTILE", "FigureScale", "maps_are_signed", "scale_maps"]

RULES = ("per_map", "shared")
"""The normalisation rules a figure may use."""

SEQUENTIAL = "inferno"
"""Perceptually uniform colormap for non-negative relevance."""
DIVERGING = "RdBu_r"
"""Diverging colormap for signed relevance: blue against, white none, red for."""

SIGNED_PERCENTILE = 99.0
"""Signed maps under "per_map" reach full colour at this percentile of their |relevance|."""

_FLAT = 1e-6
"""A map whose range is below this fraction of its magnitude is constant (upsampling a
constant map rounds in the last bits)."""


@dataclass(frozen=True)
class FigureScale:
    """The scaled maps of one figure and what the figure must say about them.

    Attributes:
        maps: the maps in display units, in [0, 1] (unsigned) or [-1, 1] (signed).
        notes: per map, "all-zero map", "constant map" or None.
        signed: per map, whether it is drawn on the diverging scale.
        rule: "per_map" or "shared".
        peaks: under "shared", per kind of map present (False: unsigned, True: signed),
            the relevance that display value 1 stands for; empty under "per_map".
    """

    maps: list[np.ndarray]
    notes: list[str | None]
    signed: list[bool]
    rule: str
    peaks: dict[bool, float]

    def keys(self) -> list[bool]:
        """The colour keys the figure needs: False for the sequential one, True for the
        diverging one (both when it mixes unsigned and signed maps)."""
        return sorted(set(self.signed)) or [False]

    def caption(self) -> str:
        """One line for the figure that states the rule."""
        if self.rule == "shared":
            if len(self.keys()) > 1:
                unsigned, signed = self.peaks[False], self.peaks[True]
                return (
                    f"One shared scale per kind of map: unsigned maps 0 to {unsigned:.3g}, "
                    f"signed maps (marked ±) -{signed:.3g} to {signed:.3g} (red for, blue "
                    "against), each with its key; opacity follows |relevance|."
                )
            (signed,) = self.keys()
            peak = self.peaks.get(signed, 0.0)
            low = f"-{peak:.3g}" if signed else "0"
            return (
                f"One scale for every map ({low} to {peak:.3g}, bar); opacity follows |relevance|."
            )
        top = f"{SIGNED_PERCENTILE:g}th percentile of |relevance|"
        if all(self.signed):
            return (
                f"Each map divided by its own {top}, clipped (red for, blue against; "
                "no common scale); opacity follows |relevance|."
            )
        if any(self.signed):
            return (
                "Each map scaled on its own (no common scale): min-max, or for signed maps "
                f"(marked ±) by their {top}, clipped (red for, blue against); opacity follows "
                "|relevance|."
            )
        return (
            "Each map min-max scaled to its own range (no common scale); opacity follows relevance."
        )

    def key_ticks(self, signed: bool) -> tuple[list[float], list[str]]:
        """Ticks (display units) and labels of the sequential or the diverging key."""
        if self.rule == "shared":
            peak = self.peaks.get(signed, 0.0)
            if signed:
                return [-1.0, 0.0, 1.0], [f"{-peak:.3g}", "0", f"{peak:.3g}"]
            return [0.0, 1.0], ["0", f"{peak:.3g}"]
        if signed:
            top = f"p{SIGNED_PERCENTILE:g}|R|"
            return [-1.0, 0.0, 1.0], [f"-{top}", "0", f"+{top}"]
        return [0.0, 1.0], ["map min", "map max"]

    def key_label(self, signed: bool) -> str:
        """What a key applies to; with both keys, the signed maps are the panels marked ±
        (short labels: two keys share the bar's height)."""
        if self.rule == "shared":
            if len(self.keys()) > 1:
                return "signed, marked ± (shared scale)" if signed else "unsigned (shared scale)"
            return "relevance (shared scale)"
        if len(self.keys()) > 1:
            return "signed maps, marked ±" if signed else "unsigned maps"
        return "signed maps" if signed else "each map's own range"


def _note(raw: np.ndarray) -> str | None:
    magnitude = float(np.abs(raw).max()) if raw.size else 0.0
    if magnitude == 0.0:
        return "all-zero map"
    if float(raw.max() - raw.min()) <= _FLAT * magnitude:
        return "constant map"
    return None


def scale_maps(
    maps: Sequence[np.ndarray], rule: str = "per_map", signed: bool | None = None
) -> FigureScale:
    """Scale the raw relevance maps of one figure by `rule` (see the module docstring).

    `signed` None: each map is signed when it holds a negative value; True or False:
    every map (but the all-zero and constant ones) is drawn on that kind of scale, as a
    figure of one method's maps says (one scale per method, decided by the caller on
    the maps before they were upsampled: `maps_are_signed`)."""
    if rule not in RULES:
        raise InputError(f"unknown scale {rule!r}; use one of {', '.join(RULES)}")
    raw = [np.asarray(m, dtype=np.float64) for m in maps]
    if any(not np.isfinite(m).all() for m in raw):
        raise InputError("a relevance map holds NaN or infinite values; nothing can be drawn")
    notes = [_note(m) for m in raw]
    kinds = [bool(m.min() < 0) if signed is None else signed for m in raw]
    signed = [note is None and kind for kind, note in zip(kinds, notes, strict=True)]
    if rule == "shared":  # one scale per kind of map
        peaks = {
            kind: max(
                (
                    float(np.abs(m).max())
                    for m, s in zip(raw, signed, strict=True)
                    if s == kind and m.size
                ),
                default=0.0,
            )
            for kind in set(signed)
        }
        shared = []
        for m, kind in zip(raw, signed, strict=True):
            shown = m / peaks[kind] if peaks[kind] > 0 else np.zeros_like(m)
            shared.append(shown if kind else np.clip(shown, 0.0, 1.0))
        return FigureScale(shared, notes, signed, rule, peaks)
    scaled = []
    for m, note, negative in zip(raw, notes, signed, strict=True):
        if note is not None:
            scaled.append(np.zeros_like(m))
        elif negative:
            top = float(np.percentile(np.abs(m), SIGNED_PERCENTILE))
            scaled.append(np.clip(m / (top if top > 0 else np.abs(m).max()), -1.0, 1.0))
        else:
            scaled.append((m - m.min()) / (m.max() - m.min()))
    return FigureScale(scaled, notes, signed, rule, {})


def maps_are_signed(maps: object) -> bool:
    """Whether one method's maps are drawn signed: any of them holds a negative value, read
    on the maps as the method made them (a patch grid), before any upsampling, whose
    interpolation and filling of unseen pixels would otherwise decide it per map."""
    return bool((np.asarray(maps, dtype=np.float64) < 0).any())
