"""SaCo, the salience-guided faithfulness coefficient (Wu et al., CVPR 2024).

Cumulative perturbation curves conflate what each group of pixels does with what the
groups before it did. SaCo removes groups one at a time and asks whether the map's
ordering of their total relevance agrees with their effects. For the predicted class's
map (upsampled bilinearly to the image and min-max normalised, as in the other image
tests), the H x W pixels are sorted by relevance (most relevant first, ties in raster
order) and cut into K = 10 groups of equal size (group k: ranks floor(k H W / K) ..
floor((k + 1) H W / K) - 1). For each group G_k alone, its pixels are replaced by the
image's per-channel mean (on the [0, 1] pixels, before normalisation; the reference's
"per-sample mean"), and its effect is the drop of the predicted class's probability,
d_k = p(y | x) - p(y | x with G_k replaced) (softmax, or the class's sigmoid for a
multi-label model). With s_k the sum of the map over G_k, every pair i < j contributes
w = s_i - s_j (>= 0: the groups are in decreasing relevance) when d_i >= d_j, and -w
when not; SaCo = sum of the contributions / sum of |w|, in [-1, 1] (1: every more relevant
group hurts the prediction at least as much; -1: the opposite). A map whose groups all
sum alike (a constant map) carries no order and scores 0. SaCo needs no label: every
image counts, with its predicted class. Higher is better.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from explain.evaluation.datasets.base import ImageExample
from explain.evaluation.perturbation import removal_order, removal_rank
from explain.evaluation.protocol import (
    Column,
    Field,
    ImageProtocol,
    Records,
    as_terms,
    method_options,
)

__all__ = ["GROUPS", "SaCoTest", "saco", "salience_groups"]

GROUPS = 10
"""K, the number of equal groups of pixels."""


def salience_groups(heatmaps: Tensor, groups: int = GROUPS) -> Tensor:
    """(B, H, W) maps -> (B, H, W) long: each pixel's group, the largest k whose first
    rank floor(k H W / K) is at most the pixel's rank (0: the most relevant), ties in
    raster order."""
    count = heatmaps[0].numel()
    rank = removal_rank(removal_order(heatmaps, positive=True))
    return (((rank + 1) * groups + count - 1) // count - 1).view(heatmaps.shape)


def saco(salience: Tensor, drops: Tensor) -> Tensor:
    """SaCo of (B, K) group saliences (in decreasing order) and (B, K) probability drops:
    (B,) in [-1, 1]; 0 where every pair's salience difference is 0."""
    first, second = torch.triu_indices(salience.shape[1], salience.shape[1], offset=1)
    weight = salience[:, first] - salience[:, second]
    agree = drops[:, first] >= drops[:, second]
    total = weight.abs().sum(dim=1)
    signed = torch.where(agree, weight, -weight).sum(dim=1)
    return torch.where(total > 0, signed / total.clamp(min=torch.finfo(total.dtype).tiny), 0.0)


class SaCoTest(ImageProtocol):
    """SaCo (module doc) for one image model.

    Args:
        model, mean, std, forward_batch: see `ImageProtocol`.
        multi_label: True when each logit is an independent yes/no decision (the class's
            sigmoid is its probability), False for one softmax over the classes.

    Records per image: the prediction, each group's probability drop and SaCo.
    """

    name = "saco"

    def __init__(
        self,
        model: nn.Module,
        mean: Sequence[float],
        std: Sequence[float],
        *,
        multi_label: bool,
        forward_batch: int | None = None,
    ) -> None:
        super().__init__(model, mean, std, forward_batch=forward_batch)
        self.multi_label = multi_label

    columns: ClassVar[Mapping[str, Column]] = {
        "accuracy": Column("accuracy"),
        "saco": Column("SaCo", "higher"),
    }

    fields: ClassVar[Mapping[str, Field]] = {
        "label": Field(int, low=-1),
        "predicted": Field(int, low=0),
        "saco": Field(float, -1.0, 1.0),
        "drops": Field(float, -1.0, 1.0, width=GROUPS),
    }

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "multi_label": self.multi_label}

    def scale(self) -> str:
        return (
            f"SaCo in [-1, 1] over {GROUPS} equal groups of pixels of the predicted class's "
            "map, each replaced alone by the image's per-channel mean; the mean over images."
        )

    def evaluate(self, method: str, examples: Sequence[ImageExample], *, seed: int = 0) -> Records:
        pixels, labels = self.stack(examples)
        explanation = self.explainer.explain(
            self.normalize(pixels), target=None, method=method, **method_options(method, seed)
        )
        heatmaps = explanation.heatmap(tuple(pixels.shape[-2:])).cpu().double()
        logits = explanation.logits.detach().cpu()
        predicted = logits.argmax(dim=-1)
        rows = torch.arange(len(examples))
        clean = self.probabilities(logits)[rows, predicted]
        groups = salience_groups(heatmaps, GROUPS)  # (B, H, W)
        members = groups[None] == torch.arange(GROUPS)[:, None, None, None]  # (K, B, H, W)
        salience = (members * heatmaps[None]).sum(dim=(2, 3)).T  # (B, K)
        fill = pixels.mean(dim=(2, 3))[None, :, :, None, None]  # per image and channel
        copies = torch.where(members[:, :, None], fill, pixels[None])  # (K, B, 3, H, W)
        perturbed = self.probabilities(self.logits(copies.flatten(0, 1)))
        perturbed = perturbed.view(GROUPS, len(examples), -1)[:, rows, predicted].T
        drops = clean[:, None] - perturbed  # (B, K)
        return {
            "label": labels.tolist(),
            "predicted": predicted.tolist(),
            "saco": saco(salience, drops).tolist(),
            "drops": drops.tolist(),
        }

    def terms(self, records: Records) -> dict[str, Tensor]:
        drops = torch.tensor(records["drops"], dtype=torch.float64).reshape(-1, GROUPS)
        return {
            "saco": as_terms(records["saco"]),
            **{f"drop@{k}": drops[:, k] for k in range(GROUPS)},
        }

    def from_sums(self, sums: Mapping[str, Tensor], count: int) -> dict[str, Tensor]:
        return {"saco": sums["saco"] / count}

    def summarize(self, records: Records) -> dict[str, Any]:
        sums, count = self.summed(records)
        known = [(p, t) for p, t in zip(records["predicted"], records["label"], strict=True)]
        known = [(p, t) for p, t in known if t >= 0]
        return {
            "accuracy": sum(int(p == t) for p, t in known) / len(known) if known else None,
            **self.totals(sums, count),
            "drops": [float(sums[f"drop@{k}"] / count) for k in range(GROUPS)],
        }
