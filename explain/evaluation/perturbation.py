"""The perturbation test (Chefer, Gur & Wolf, CVPR 2021).

For each fraction p in 0.1 .. 0.9, the floor(p * H * W) pixels with the highest relevance
(positive test) or the lowest (negative test) are set to 0 in all channels of the [0, 1]
image, BEFORE the model's normalisation, and top-1 accuracy against the ground-truth
label is measured. The AUC is the trapezoid area of accuracy over x = 0, 0.1, ..., 0.9
(the unperturbed accuracy at x = 0), times 100, so at most 90. Positive: lower is better
(removing what the map calls relevant should hurt); negative: higher is better. Both are
run for maps of the predicted class and of the ground-truth class.

Pixels of equal relevance are removed in raster order (row by row), so every run removes
the same pixels; the authors' code uses `torch.topk`, which leaves the order of ties
undefined. The authors print per-step accuracies and fix no AUC formula: integrating from
x = 0 reads higher than integrating over 10% ... 90% only (at most 80), which
`auc_range="10-90"` gives.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from explain.errors import OptionError
from explain.evaluation.datasets.base import ImageExample
from explain.evaluation.protocol import (
    Column,
    Field,
    ImageProtocol,
    Records,
    as_terms,
    method_options,
)

__all__ = [
    "AUC_RANGES",
    "CURVES",
    "FRACTIONS",
    "PerturbationTest",
    "accuracy_curve",
    "checked_auc_range",
    "curve_hits",
    "hit_terms",
    "perturbation_auc",
    "perturbed_copies",
    "removal_order",
    "removal_rank",
    "removal_ranks",
    "removed_count",
    "removed_masks",
]

FRACTIONS: tuple[float, ...] = tuple(k / 10 for k in range(1, 10))
"""The removed fractions of the protocol; the AUC adds x = 0 (the unperturbed accuracy)."""

CURVES: tuple[str, ...] = (
    "positive_predicted",
    "negative_predicted",
    "positive_target",
    "negative_target",
)
"""(which pixels go first)_(whose class the map explains)."""


def removed_count(fraction: float, pixels: int) -> int:
    """floor(fraction * pixels), immune to binary float error (0.3 * 50 is 15, not 14)."""
    return math.floor(round(fraction * pixels, 6))


def removal_order(heatmaps: Tensor, positive: bool) -> Tensor:
    """(B, H, W) maps -> (B, H * W) pixel indices in the order they are removed.

    Most relevant first for the positive test, least relevant first for the negative one.
    The sort is stable, so ties go in raster order and every run removes the same pixels.
    """
    return torch.sort(heatmaps.flatten(1), dim=1, descending=positive, stable=True).indices


def removal_rank(order: Tensor) -> Tensor:
    """(B, N) elements in the order they are removed -> (B, N) the rank at which each
    element is removed, 0 first (the inverse permutation)."""
    positions = torch.arange(order.shape[1], device=order.device).expand_as(order)
    return torch.empty_like(order).scatter_(1, order, positions)


def removed_masks(order: Tensor, fractions: Sequence[float]) -> Tensor:
    """(F, B, N) bool: for each fraction p, the first floor(p * N) elements of the (B, N)
    `order`."""
    count = order.shape[1]
    cuts = torch.tensor([removed_count(p, count) for p in fractions], device=order.device)
    return removal_rank(order)[None] < cuts[:, None, None]


def perturbed_copies(pixels: Tensor, order: Tensor, fractions: Sequence[float]) -> Tensor:
    """Copies of (B, C, H, W) `pixels` with the first floor(p * H * W) pixels of `order`
    zeroed in every channel, one copy per fraction p: shape (F, B, C, H, W)."""
    batch, _, height, width = pixels.shape
    keep = ~removed_masks(order, fractions)
    keep = keep.view(len(fractions), batch, 1, height, width).to(pixels.device, pixels.dtype)
    return pixels[None] * keep


def removal_ranks(scores: Tensor, allowed: Tensor, positive: bool) -> Tensor:
    """(B, N) scores -> (B, N) long: when each allowed element is removed (0 first), most
    relevant first (`positive`) or least relevant first, ties in position order; elements
    not allowed get N (never removed)."""
    last = float("-inf") if positive else float("inf")
    order = removal_order(torch.where(allowed, scores, last)[:, None, :], positive)
    return torch.where(allowed, removal_rank(order), scores.shape[1])


AUC_RANGES: dict[str, str] = {
    "0-90": "100 x the area under the curve from x = 0 (unperturbed) to x = 0.9, at most 90",
    "10-90": "100 x the area under the curve from x = 0.1 to x = 0.9, at most 80",
}
"""What each AUC variant integrates over (`auc_range`), as the tables state it."""


def checked_auc_range(auc_range: str) -> str:
    """`auc_range` when it is one of AUC_RANGES; an OptionError naming them otherwise."""
    if auc_range not in AUC_RANGES:
        raise OptionError(f"auc_range must be one of {', '.join(AUC_RANGES)}, got {auc_range!r}")
    return auc_range


def perturbation_auc(
    accuracies: Sequence[float],
    fractions: Sequence[float] = FRACTIONS,
    *,
    auc_range: str = "0-90",
) -> float:
    """100 x the trapezoid area under `accuracies` over x = (0, *fractions), or over
    `fractions` only when `auc_range` is "10-90".

    `accuracies` has one more entry than `fractions`: the unperturbed accuracy first.
    """
    xs = (0.0, *fractions)
    if len(accuracies) != len(xs):
        raise ValueError(f"expected {len(xs)} accuracies (x = 0 first), got {len(accuracies)}")
    first = 0 if checked_auc_range(auc_range) == "0-90" else 1
    area = sum(
        (xs[i + 1] - xs[i]) * (accuracies[i] + accuracies[i + 1]) / 2
        for i in range(first, len(xs) - 1)
    )
    return 100.0 * area


class PerturbationTest(ImageProtocol):
    """The perturbation test of one image model.

    Args:
        model, mean, std, forward_batch: see `ImageProtocol`.
        auc_range: "0-90" (from the unperturbed accuracy at x = 0) or "10-90"; it changes
            only the summary, never the records, so a finished run can be summarised
            either way.

    Records per image: the unperturbed prediction and, per curve (CURVES), whether the
    image is still classified correctly at each fraction.
    """

    name = "perturbation"

    def __init__(
        self,
        model: nn.Module,
        mean: Sequence[float],
        std: Sequence[float],
        forward_batch: int | None = None,
        auc_range: str = "0-90",
    ) -> None:
        super().__init__(model, mean, std, forward_batch=forward_batch)
        self.auc_range = checked_auc_range(auc_range)

    columns: ClassVar[Mapping[str, Column]] = {
        "accuracy": Column("accuracy"),
        "positive_auc_predicted": Column("positive AUC, predicted", "lower"),
        "negative_auc_predicted": Column("negative AUC, predicted", "higher"),
        "positive_auc_target": Column("positive AUC, target", "lower"),
        "negative_auc_target": Column("negative AUC, target", "higher"),
    }

    fields: ClassVar[Mapping[str, Field]] = {
        "label": Field(int, low=0),
        "predicted": Field(int, low=0),
        "correct": Field(int, 0, 1),
        **{curve: Field(int, 0, 1, width=len(FRACTIONS)) for curve in CURVES},
    }

    def scale(self) -> str:
        return f"AUC: {AUC_RANGES[self.auc_range]} (auc_range {self.auc_range})."

    def evaluate(self, method: str, examples: Sequence[ImageExample], *, seed: int = 0) -> Records:
        pixels, labels = self.stack(examples)
        inputs = self.normalize(pixels)
        options = method_options(method, seed)
        explained = {
            "predicted": self.explainer.explain(inputs, target=None, method=method, **options),
            "target": self.explainer.explain(
                inputs, target=labels.to(inputs.device), method=method, **options
            ),
        }
        predicted = explained["predicted"].logits.argmax(dim=-1).cpu()
        records: Records = {
            "label": labels.tolist(),
            "predicted": predicted.tolist(),
            "correct": (predicted == labels).int().tolist(),
        }
        size = tuple(pixels.shape[-2:])
        maps = {whose: explanation.heatmap(size).cpu() for whose, explanation in explained.items()}
        # Where the target's map equals the predicted class's (a class-agnostic method, or a
        # correct prediction) the perturbed images are the same: classify them only once.
        differs = (maps["target"] != maps["predicted"]).flatten(1).any(dim=1)
        for sign in ("positive", "negative"):
            positive = sign == "positive"
            hits = curve_hits(self.classify, pixels, labels, maps["predicted"], positive)
            target_hits = hits.clone()
            if differs.any():
                own = maps["target"][differs]
                target_hits[differs] = curve_hits(
                    self.classify, pixels[differs], labels[differs], own, positive
                )
            records[f"{sign}_predicted"] = hits.int().tolist()
            records[f"{sign}_target"] = target_hits.int().tolist()
        return records

    def terms(self, records: Records) -> dict[str, Tensor]:
        return hit_terms(records, CURVES)

    def from_sums(self, sums: Mapping[str, Tensor], count: int) -> dict[str, Tensor]:
        ranked = {}
        for curve in CURVES:
            sign, whose = curve.split("_")
            ranked[f"{sign}_auc_{whose}"] = perturbation_auc(
                accuracy_curve(sums, curve, count), auc_range=self.auc_range
            )
        return ranked

    def summarize(self, records: Records) -> dict[str, Any]:
        sums, count = self.summed(records)
        curves: dict[str, list[float]] = {"fractions": [0.0, *FRACTIONS]}
        for curve in CURVES:
            curves[curve] = [float(value) for value in accuracy_curve(sums, curve, count)]
        return {"accuracy": curves[CURVES[0]][0], **self.totals(sums, count), "curves": curves}


def hit_terms(records: Records, curves: Sequence[str]) -> dict[str, Tensor]:
    """The per-example terms of accuracy curves (see `EvaluationProtocol.terms`): the
    unperturbed "correct" and, per curve, CURVE@i, its hit at the i-th fraction."""
    terms = {"correct": as_terms(records["correct"])}
    for curve in curves:
        hits = torch.tensor(records[curve], dtype=torch.float64).reshape(-1, len(FRACTIONS))
        terms.update({f"{curve}@{i}": hits[:, i] for i in range(len(FRACTIONS))})
    return terms


def accuracy_curve(sums: Mapping[str, Tensor], curve: str, count: int) -> list[Tensor]:
    """The mean accuracy at x = 0 and after each fraction, from sums of `hit_terms`."""
    return [sums["correct"] / count, *(sums[f"{curve}@{i}"] / count for i in range(len(FRACTIONS)))]


def curve_hits(
    classify: Callable[[Tensor], Tensor],
    pixels: Tensor,
    labels: Tensor,
    heatmaps: Tensor,
    positive: bool,
    fractions: Sequence[float] = FRACTIONS,
    remove: Callable[[Tensor, Tensor, Sequence[float]], Tensor] = perturbed_copies,
) -> Tensor:
    """(B, F) bool: whether each image is still classified correctly at each fraction,
    its pixels removed by `remove` (pixels, order, fractions) -> (F, B, C, H, W) copies:
    zeroed by default (`perturbed_copies`).

    All fractions of the chunk go to `classify` together, so it can batch them.
    """
    order = removal_order(heatmaps, positive)
    copies = remove(pixels, order, fractions)
    classes = classify(copies.flatten(0, 1)).view(len(fractions), len(pixels))
    return (classes == labels[None]).T
