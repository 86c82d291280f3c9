"""The verdict on a citation: the ablation check's figures (explain.cite.check) read into
words, and the one way its numbers are written for people. The page, the terminal and
cite.json all print `verdict(check)`, so the three always say the same thing.

The rule (docs/cite.md, "The verdict"), for any sources the check removes (a context's
spans, a photo's regions):

- a top-k drop is *clear* when it exceeds the random drop's mean by at least the random
  drop's standard deviation and by at least `NOISE` nats (removal itself moves the answer
  by a few hundredths), and the ranking does not tie at its k-th span (a tied top-k set
  is the spans' order, not the ranking's);
- the LDS band: "high" from `LDS_HIGH`, "moderate" from `LDS_MODERATE`, "low" below it or
  when undefined (the scores or the ablations' targets all equal), "not computed" without
  LDS ablations;
- **supported**: the top-1 drop is clear and the LDS band is not low;
- **weak**: some top-k drop is clear, but not the top-1's, or the LDS band is low;
- **not supported by ablation**: no top-k drop is clear;
- **not checked**: one source, which nothing can be compared with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ABLATION",
    "LDS_HIGH",
    "LDS_MODERATE",
    "NOISE",
    "WORDS",
    "Check",
    "TopKDrop",
    "Verdict",
    "clear",
    "lds_band",
    "number",
    "random_sets",
    "verdict",
]

NOISE = 0.1
"""Nats: a top-k drop must beat the random mean by at least this much to count."""
LDS_HIGH = 0.6
LDS_MODERATE = 0.3
WORDS = ("supported", "weak", "not supported by ablation", "not checked")
_DIGITS = 3
"""Significant digits of every number written for people."""


ABLATION = (
    "removed: the ablated spans' tokens are cut out of the prompt, the rest of it (template, "
    "question, other spans) kept in order"
)


@dataclass(frozen=True)
class TopKDrop:
    """The target's drop when the k top-ranked spans are removed, and the mean (and
    standard deviation) of its drop over `sets` sets of k spans: every k-set when
    `exact`, else `sets` random ones (module doc). `tied`: the k-th and (k + 1)-th
    scores are equal, so which spans make the top k is the order of the spans, not the
    ranking."""

    k: int
    top: float
    random: float
    random_std: float
    sets: int
    exact: bool
    tied: bool


@dataclass(frozen=True)
class Check:
    """The ablation check of one ranking (module doc): `full` is the target with the
    whole context; `lds` None when not asked for (or undefined: the scores or the targets
    of the ablations are all equal)."""

    target: str
    full: float
    drops: tuple[TopKDrop, ...]
    draws: int
    lds: float | None
    lds_ablations: int
    seed: int
    ablation: str = ABLATION

    @property
    def verdict(self) -> Verdict:
        """The check in words (explain.cite.verdict)."""
        return verdict(self)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values, as cite.json holds them; `verdict` and
        `verdict_reason` are derived (from_dict reads neither)."""
        said = self.verdict
        return {
            "verdict": said.word,
            "verdict_reason": said.reason,
            "ablation": self.ablation,
            "target": self.target,
            "full": self.full,
            "top_k": [
                {
                    "k": d.k,
                    "drop": d.top,
                    "random_drop": d.random,
                    "random_std": d.random_std,
                    "random_sets": d.sets,
                    "random_exact": d.exact,
                    "tied": d.tied,
                }
                for d in self.drops
            ],
            "random_draws": self.draws,
            "lds": self.lds,
            "lds_ablations": self.lds_ablations,
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Check:
        return cls(
            target=values["target"],
            full=values["full"],
            drops=tuple(
                TopKDrop(
                    d["k"],
                    d["drop"],
                    d["random_drop"],
                    d["random_std"],
                    d["random_sets"],
                    d["random_exact"],
                    d["tied"],
                )
                for d in values["top_k"]
            ),
            draws=values["random_draws"],
            lds=values["lds"],
            lds_ablations=values["lds_ablations"],
            seed=values["seed"],
            ablation=values["ablation"],
        )


def number(value: float, signed: bool = False) -> str:
    """`value` with 3 significant digits: fixed notation from 0.001 to 10,000 ("0.802",
    "2.31", "123"), scientific outside ("3.12e-06"); exactly 0 is "0" (never "+0.0000");
    `signed` puts "+" before a positive value."""
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return str(value)
    sign = "+" if signed else ""
    size = abs(value)
    if 1e-3 <= size < 1e4:
        decimals = max(0, _DIGITS - 1 - math.floor(math.log10(size)))
        return f"{value:{sign}.{decimals}f}"
    return f"{value:{sign}.{_DIGITS - 1}e}"


@dataclass(frozen=True)
class Verdict:
    """One of `WORDS`, and the sentence of figures that decided it."""

    word: str
    reason: str

    def __str__(self) -> str:
        return f"{self.word}: {self.reason}"


def clear(drop: TopKDrop) -> bool:
    """Whether removing the top k spans moves the target beyond chance (module doc)."""
    margin = drop.top - drop.random
    return not drop.tied and margin >= NOISE and margin >= drop.random_std


def lds_band(check: Check) -> str:
    """ "high", "moderate", "low" or "not computed" (module doc)."""
    if not check.lds_ablations:
        return "not computed"
    if check.lds is None or check.lds < LDS_MODERATE:
        return "low"
    return "high" if check.lds >= LDS_HIGH else "moderate"


def random_sets(drop: TopKDrop) -> str:
    """What the random drop is over: "all 10 sets" (exact) or "16 random sets"."""
    return f"all {drop.sets} sets" if drop.exact else f"{drop.sets} random sets"


def _compared(drop: TopKDrop) -> str:
    sets = random_sets(drop)
    tie = "; the scores tie at the cut" if drop.tied else ""
    return (
        f"top-{drop.k} drop {number(drop.top)} against {number(drop.random)} "
        f"± {number(drop.random_std)} ({sets}{tie})"
    )


def verdict(check: Check) -> Verdict:
    """The verdict on one ranking's check (module doc)."""
    if not check.drops:
        return Verdict("not checked", "one source: there is nothing to compare it with")
    band = lds_band(check)
    lds = (
        "LDS not computed"
        if band == "not computed"
        else f"LDS {'undefined' if check.lds is None else number(check.lds)} "
        f"({band}, {check.lds_ablations} ablations)"
    )
    first = check.drops[0]
    beyond = [drop for drop in check.drops if clear(drop)]
    if not beyond:
        compared = "; ".join(_compared(drop) for drop in check.drops)
        return Verdict(
            "not supported by ablation",
            f"removing the top-ranked ones moves {check.target} no more than removing "
            f"random ones: {compared}; {lds}",
        )
    if clear(first) and band != "low":
        return Verdict("supported", f"{_compared(first)}; {lds}")
    if clear(first):
        return Verdict("weak", f"{_compared(first)}, but the scores do not add up: {lds}")
    return Verdict(
        "weak",
        f"the top-ranked one alone is no better than chance ({_compared(first)}); the "
        f"top {beyond[0].k} together are ({_compared(beyond[0])}); {lds}",
    )
