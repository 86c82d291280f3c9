"""The segmentation test (Chefer, Gur & Wolf, CVPR 2021, on ImageNet-segmentation).

Each map of the predicted class is upsampled bilinearly to the image size, min-max
normalised, and thresholded at its own mean: foreground where it is above the mean.
Pixel accuracy and the IoU of background and foreground are accumulated over the whole
dataset (sum of correct / sum of labelled; sum of intersections / sum of unions), and
mIoU is the mean of the two IoUs. mAP is the average precision per image, averaged over
images; as in the reference, a map's AP pools two score channels, the map for the
foreground and 1 - map for the background, against the one-hot mask.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from explain.errors import InputError
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
    "SEGMENTATION_FIELDS",
    "SegmentationCounts",
    "SegmentationTest",
    "average_precision",
    "counts_to_records",
    "segmentation_counts",
    "segmentation_from_sums",
    "segmentation_summary",
    "segmentation_terms",
]


@dataclass(frozen=True)
class SegmentationCounts:
    """One image's contribution to the dataset-wide sums, and its average precision.

    `intersection` and `union` are (background, foreground) pixel counts.
    """

    correct: int
    labelled: int
    intersection: tuple[int, int]
    union: tuple[int, int]
    average_precision: float


def average_precision(scores: Tensor, labels: Tensor) -> float:
    """Average precision of `scores` ranking the True entries of `labels` first.

    The step-wise sum over distinct thresholds, sum_n (R_n - R_{n-1}) P_n, the definition
    scikit-learn's `average_precision_score` uses. 0.0 when there is no positive.
    """
    scores = scores.flatten().double()
    labels = labels.flatten().bool()
    positives = int(labels.sum())
    if positives == 0:
        return 0.0
    order = torch.sort(scores, descending=True, stable=True).indices
    ranked_scores, ranked_labels = scores[order], labels[order].double()
    true_positives = ranked_labels.cumsum(0)
    # Only the last position of each run of equal scores is a threshold.
    last = torch.ones_like(ranked_scores, dtype=torch.bool)
    last[:-1] = ranked_scores[1:] != ranked_scores[:-1]
    hits = true_positives[last]
    precision = hits / (torch.nonzero(last).flatten() + 1).double()
    recall = hits / positives
    steps = torch.diff(recall, prepend=recall.new_zeros(1))
    return float((steps * precision).sum())


def segmentation_counts(heatmap: Tensor, mask: Tensor) -> SegmentationCounts:
    """Score one (H, W) min-max normalised map against its (H, W) mask.

    Foreground is predicted where the map exceeds its own mean. Mask pixels < 0 are
    unlabelled and count nowhere.
    """
    if heatmap.shape != mask.shape:
        raise InputError(
            f"map {tuple(heatmap.shape)} and mask {tuple(mask.shape)} differ in size; "
            "upsample the map to the image size first"
        )
    labelled = mask >= 0
    truth = mask > 0
    predicted = heatmap > heatmap.mean()
    correct = int(((predicted == truth) & labelled).sum())
    intersection, union = [], []
    for predicted_class, true_class in ((~predicted, ~truth), (predicted, truth)):
        intersection.append(int((predicted_class & true_class & labelled).sum()))
        union.append(int(((predicted_class | true_class) & labelled).sum()))
    kept = heatmap[labelled]
    scores = torch.cat([1.0 - kept, kept])
    one_hot = torch.cat([~truth[labelled], truth[labelled]])
    return SegmentationCounts(
        correct=correct,
        labelled=int(labelled.sum()),
        intersection=(intersection[0], intersection[1]),
        union=(union[0], union[1]),
        average_precision=average_precision(scores, one_hot),
    )


def segmentation_summary(counts: Sequence[SegmentationCounts]) -> dict[str, float]:
    """Pixel accuracy, per-class IoU, mIoU and mAP, all fractions in [0, 1]."""
    terms = segmentation_terms(counts_to_records(counts))
    sums = {name: values.sum() for name, values in terms.items()}
    return {key: float(value) for key, value in segmentation_from_sums(sums, len(counts)).items()}


def segmentation_terms(records: Records) -> dict[str, Tensor]:
    """The per-example additive terms of the segmentation numbers (see
    `EvaluationProtocol.terms`)."""
    terms = {key: as_terms(records[key]) for key in ("correct", "labelled", "average_precision")}
    for key in ("intersection", "union"):
        pairs = torch.tensor(records[key], dtype=torch.float64).reshape(-1, 2)
        terms[f"{key}_background"], terms[f"{key}_foreground"] = pairs[:, 0], pairs[:, 1]
    return terms


def segmentation_from_sums(sums: Mapping[str, Tensor], count: int) -> dict[str, Tensor]:
    """Pixel accuracy, per-class IoU, mIoU and mAP from sums of `segmentation_terms`:
    the counts are summed over the dataset before dividing (0 where nothing is counted)."""

    def ratio(numerator: Tensor, denominator: Tensor) -> Tensor:
        return torch.where(denominator > 0, numerator / denominator.clamp(min=1), 0.0)

    ious = [
        ratio(sums[f"intersection_{k}"], sums[f"union_{k}"]) for k in ("background", "foreground")
    ]
    return {
        "pixel_accuracy": ratio(sums["correct"], sums["labelled"]),
        "miou": (ious[0] + ious[1]) / 2,
        "iou_background": ious[0],
        "iou_foreground": ious[1],
        "map": sums["average_precision"] / max(count, 1),
    }


SEGMENTATION_FIELDS: Mapping[str, Field] = {
    "correct": Field(int, low=0),
    "labelled": Field(int, low=0),
    "intersection": Field(int, low=0, width=2),
    "union": Field(int, low=0, width=2),
    "average_precision": Field(float, 0.0, 1.0),
}
"""The records `counts_to_records` writes, per image."""


def counts_to_records(counts: Sequence[SegmentationCounts]) -> Records:
    """Per-example records (JSON-able columns) of the images' counts."""
    return {
        "correct": [c.correct for c in counts],
        "labelled": [c.labelled for c in counts],
        "intersection": [list(c.intersection) for c in counts],
        "union": [list(c.union) for c in counts],
        "average_precision": [c.average_precision for c in counts],
    }


class SegmentationTest(ImageProtocol):
    """The segmentation test of one image model on examples with masks.

    The map explains the predicted class, as in the reference evaluation.
    """

    name = "segmentation"

    columns: ClassVar[Mapping[str, Column]] = {
        "pixel_accuracy": Column("pixel accuracy", "higher"),
        "miou": Column("mIoU", "higher"),
        "map": Column("mAP", "higher"),
    }

    fields: ClassVar[Mapping[str, Field]] = {
        "label": Field(int, low=-1),  # -1: not known (gtsegs_ijcv.mat)
        "predicted": Field(int, low=0),
        **SEGMENTATION_FIELDS,
    }

    def evaluate(self, method: str, examples: Sequence[ImageExample], *, seed: int = 0) -> Records:
        if any(example.mask is None for example in examples):
            raise InputError(
                "the segmentation test needs examples with masks; this dataset has none"
            )
        pixels, labels = self.stack(examples)
        explanation = self.explainer.explain(
            self.normalize(pixels), target=None, method=method, **method_options(method, seed)
        )
        heatmaps = explanation.heatmap(tuple(pixels.shape[-2:])).cpu()
        counts = [
            segmentation_counts(heatmap, example.mask.cpu().long())
            for heatmap, example in zip(heatmaps, examples, strict=True)
        ]
        predicted = explanation.logits.argmax(dim=-1).cpu()
        return {
            "label": labels.tolist(),
            "predicted": predicted.tolist(),
            **counts_to_records(counts),
        }

    def terms(self, records: Records) -> dict[str, Tensor]:
        return segmentation_terms(records)

    def from_sums(self, sums: Mapping[str, Tensor], count: int) -> dict[str, Tensor]:
        return segmentation_from_sums(sums, count)

    def summarize(self, records: Records) -> dict[str, Any]:
        # Top-1 accuracy where labels are known (gtsegs_ijcv.mat has none: label -1).
        known = [
            (p, t) for p, t in zip(records["predicted"], records["label"], strict=True) if t >= 0
        ]
        accuracy = sum(int(p == t) for p, t in known) / len(known) if known else None
        return {**self.totals(*self.summed(records)), "accuracy": accuracy}
