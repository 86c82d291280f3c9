"""Where a map puts the known evidence: evidence recall over tokens, and the pointing game
over an image's patches (the language- and vision-language-evidence tests).

Ties are broken uniformly at random and the expectation is reported, computed exactly:
a map that scores every token alike lands at the chance level, not at whatever the
tokens' order would give it.

- Evidence recall: among the candidate tokens (the caller excludes the readout position,
  special tokens and padding), the first evidence token is the most relevant one. Its
  rank is 1 + the candidates ranked strictly above it + the expected number of the
  non-evidence candidates tied with it that come first in a random order (t / (e + 1)
  for t such candidates and e evidence tokens in the tie). Top-k hit: the probability
  that this rank is at most k.
- Pointing game: the map's maximum lies on a patch within `tolerance` patches (in both
  directions, diagonals included) of a patch that holds any of the object's pixels; a
  maximum shared by several patches scores the share of them that hit.
- Regions (`region_ranks`): the region pointing game, the asked region ranked first among
  an image's regions (tied first places shared), and whether removing the region a map
  ranks first lowers the answer more than removing another region (tied drops: one half).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from explain.errors import InputError
from explain.evaluation.protocol import Records

__all__ = [
    "RECALL_K",
    "EvidenceRecall",
    "RegionRanks",
    "evidence_recall",
    "object_patches",
    "pointing_hit",
    "recall_records",
    "region_ranks",
]

RECALL_K: tuple[int, ...] = (1, 2, 5)
"""The k of the top-k evidence hits."""


@dataclass(frozen=True)
class EvidenceRecall:
    """Where one map ranks one example's evidence.

    Attributes:
        hits: per k of `ks`, the probability that an evidence token is among the k most
            relevant candidates (ties broken at random).
        rank: the expected rank of the first (most relevant) evidence token, 1 = first.
    """

    hits: tuple[float, ...]
    rank: float


def evidence_recall(
    scores: Tensor, evidence: Tensor, candidates: Tensor, ks: Sequence[int] = RECALL_K
) -> EvidenceRecall | None:
    """Where (T,) `scores` rank the (T,) bool `evidence` among the (T,) bool `candidates`;
    None when no evidence token is a candidate (the example has no evidence to find)."""
    scores = scores.detach().double().cpu()
    found = (evidence & candidates).cpu()
    if not bool(found.any()):
        return None
    others = scores[(candidates & ~evidence).cpu()]
    best = scores[found].max()
    above = int((others > best).sum())
    tied = int((others == best).sum())
    tied_evidence = int((scores[found] == best).sum())
    rank = above + 1 + tied / (tied_evidence + 1)
    hits = []
    for k in ks:
        needed = k - above  # the places left for the tie, evidence first among them
        if needed <= 0:
            hits.append(0.0)
            continue
        # P(the first `needed` places of the tie all go to non-evidence tokens)
        missed = 1.0
        for i in range(min(needed, tied + 1)):
            missed *= max(tied - i, 0) / (tied + tied_evidence - i)
        hits.append(1.0 - missed)
    return EvidenceRecall(hits=tuple(hits), rank=float(rank))


def object_patches(mask: Tensor, grid: tuple[int, int]) -> Tensor:
    """(gh, gw) bool: the patches of a (gh, gw) grid over the (H, W) `mask` that hold any
    of its pixels; H and W must be whole multiples of gh and gw."""
    height, width = mask.shape
    rows, columns = grid
    if height % rows or width % columns:
        raise InputError(
            f"a {height} x {width} mask does not split into a {rows} x {columns} patch grid"
        )
    blocks = mask.bool().reshape(rows, height // rows, columns, width // columns)
    return blocks.any(dim=3).any(dim=1)


def pointing_hit(patch_map: Tensor, patches: Tensor, tolerance: int = 1) -> float:
    """The pointing game on one (gh, gw) map against the object's (gh, gw) bool `patches`:
    1.0 when the map's maximum lies within `tolerance` patches of the object, the share of
    the tied maxima that do when several patches share it."""
    if not bool(patches.any()):
        raise InputError("the pointing game needs an object: its mask is empty")
    size = 2 * tolerance + 1
    near = F.max_pool2d(patches.double()[None, None], size, stride=1, padding=tolerance)[0, 0]
    values = patch_map.detach().double().cpu()
    top = values == values.max()
    return float((top & (near.cpu() > 0)).sum()) / float(top.sum())


@dataclass(frozen=True)
class RegionRanks:
    """Where one map ranks one image's regions, and what removing them does.

    Attributes:
        first: the share of the regions tied at the top score that are the asked one (1.0:
            it alone ranks first).
        top_removal: the probability that removing the top region (one of the tied ones,
            drawn uniformly) lowers the answer's log-probability more than removing one of
            the other regions, drawn uniformly; equal log-probabilities count one half.
        asked_removal: the same for the asked region in place of the top one: the model's
            number, the same for every map.
    """

    first: float
    top_removal: float
    asked_removal: float


def _lowers_more(ablated: Tensor, region: int) -> float:
    """The probability that removing `region` leaves the answer less likely than removing
    another region drawn uniformly (ties one half)."""
    others = torch.cat([ablated[:region], ablated[region + 1 :]])
    beaten = (others > ablated[region]).double() + 0.5 * (others == ablated[region]).double()
    return float(beaten.mean())


def region_ranks(scores: Tensor, ablated: Tensor, asked: int) -> RegionRanks:
    """`RegionRanks` of (R,) region `scores` (R >= 2) against the (R,) log-probabilities
    of the answer with each region removed alone, `asked` the answer's region."""
    if scores.shape != ablated.shape or scores.dim() != 1 or len(scores) < 2:
        raise InputError(
            f"region ranks take (R,) scores and log-probabilities, R >= 2; got "
            f"{tuple(scores.shape)} and {tuple(ablated.shape)}"
        )
    scores, ablated = scores.detach().double().cpu(), ablated.detach().double().cpu()
    top = (scores == scores.max()).nonzero()[:, 0].tolist()
    return RegionRanks(
        first=float(asked in top) / len(top),
        top_removal=sum(_lowers_more(ablated, region) for region in top) / len(top),
        asked_removal=_lowers_more(ablated, asked),
    )


def recall_records(scores: Tensor, evidence: Tensor, candidates: Tensor) -> Records:
    """Per example of (B, N) `scores`: whether it has evidence among its candidates
    ("evidence"), the expected top-k hits (k in RECALL_K) and the expected rank of its
    first evidence token (0 and 0.0 without evidence)."""
    records: Records = {"evidence": [], "hits": [], "rank": []}
    for b in range(len(scores)):
        found = evidence_recall(scores[b], evidence[b], candidates[b])
        records["evidence"].append(int(found is not None))
        records["hits"].append([0.0] * len(RECALL_K) if found is None else list(found.hits))
        records["rank"].append(0.0 if found is None else found.rank)
    return records
