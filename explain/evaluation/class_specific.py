"""The class-specific test: two objects of different classes in one image, each explained
on its own.

On a one-object image the evidence for the class lies on the one salient object, so a map
that finds salient things without asking which class (rollout, raw attention) scores like
a class-specific one. Here every image holds two objects of different classes, and each
example explains one of them, the target; the other object is evidence for another
class. For the target class's map:

- perturbation: the pixels the map ranks most (positive) or least (negative) relevant
  are zeroed exactly as in the perturbation test (before normalisation, ties in raster
  order), and the TARGET class's probability is tracked: the sigmoid of its logit for a
  multi-label model, the softmax otherwise. The AUC is that of the mean probability over
  the removed fraction (`perturbation_auc`, x 100: at most 90 from x = 0, 80 for
  "10-90"). Positive: lower is better; negative: higher is better. Along the positive
  order the OTHER class's mean probability is tracked too ("other kept", higher is
  better): a class-specific map takes the target's object away first and leaves the
  other's, a class-agnostic one takes both.
- segmentation: the map thresholded at its mean against the target's mask, with the other
  object counted as background (pixel accuracy, mIoU and mAP, as in the segmentation
  test);
- "denser on target": the share of examples whose map's mean over the target object's
  pixels exceeds its mean over the other object's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from explain.errors import InputError
from explain.evaluation.datasets.base import TwoObjectExample
from explain.evaluation.perturbation import (
    AUC_RANGES,
    FRACTIONS,
    checked_auc_range,
    perturbation_auc,
    perturbed_copies,
    removal_order,
)
from explain.evaluation.protocol import (
    Column,
    Field,
    ImageProtocol,
    Records,
    as_terms,
    method_options,
)
from explain.evaluation.segmentation import (
    SEGMENTATION_FIELDS,
    counts_to_records,
    segmentation_counts,
    segmentation_from_sums,
    segmentation_terms,
)

__all__ = ["ClassSpecificTest"]

_CURVES = {"positive": "target", "negative": "target", "other_positive": "other"}
"""Each tracked curve, and whose probability it starts from at x = 0."""


class ClassSpecificTest(ImageProtocol):
    """The class-specific test of one image model on two-object examples.

    Args:
        model, mean, std, forward_batch: see `ImageProtocol`.
        multi_label: True when each logit is an independent yes/no decision (sigmoid
            probabilities), False for one softmax over the classes.
        auc_range: "0-90" or "10-90", as in `PerturbationTest` (summary only).
    """

    name = "class-specific"

    columns: ClassVar[Mapping[str, Column]] = {
        "target_probability": Column("target probability"),
        "positive_auc": Column("positive AUC, target", "lower"),
        "negative_auc": Column("negative AUC, target", "higher"),
        "other_kept_auc": Column("other kept AUC", "higher"),
        "miou": Column("mIoU, target vs rest", "higher"),
        "denser_on_target": Column("denser on target", "higher"),
    }

    def __init__(
        self,
        model: nn.Module,
        mean: Sequence[float],
        std: Sequence[float],
        *,
        multi_label: bool,
        forward_batch: int | None = None,
        auc_range: str = "0-90",
    ) -> None:
        super().__init__(model, mean, std, forward_batch=forward_batch)
        self.multi_label = multi_label
        self.auc_range = checked_auc_range(auc_range)

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "multi_label": self.multi_label}

    def scale(self) -> str:
        # Every column defined under the table: a reader of OUTPUT.md has nothing else.
        return (
            f"AUC of the class's mean probability: {AUC_RANGES[self.auc_range]} "
            f"(auc_range {self.auc_range}). Each example explains one object's class (the "
            "target) in a scene with another object of another class. target probability: "
            "the target class's probability before any pixel is removed. positive AUC, "
            "target: that probability as the pixels the target's map ranks most relevant "
            "are zeroed first; negative AUC, target: least relevant first. other kept AUC: "
            "the OTHER object's class's probability along the same positive order (a map "
            "about its own class takes the target's object away first and keeps the "
            "other's). mIoU, target vs rest: the map thresholded at its mean against the "
            "target's mask, the other object counted as background. denser on target: the "
            "share of examples whose map's mean is higher over the target's object than "
            "over the other's (0.5 by construction for a map that ignores the class)."
        )

    fields: ClassVar[Mapping[str, Field]] = {
        "label": Field(int, low=0),
        "other_label": Field(int, low=0),
        "target_probability": Field(float, 0.0, 1.0),
        "other_probability": Field(float, 0.0, 1.0),
        **{curve: Field(float, 0.0, 1.0, width=len(FRACTIONS)) for curve in _CURVES},
        **SEGMENTATION_FIELDS,
        "denser_on_target": Field(int, 0, 1),
    }

    def evaluate(
        self, method: str, examples: Sequence[TwoObjectExample], *, seed: int = 0
    ) -> Records:
        if not all(isinstance(example, TwoObjectExample) for example in examples):
            raise InputError("the class-specific test needs two-object examples (TwoObjectExample)")
        pixels, labels = self.stack(examples)
        others = torch.tensor([example.other_label for example in examples])
        explanation = self.explainer.explain(
            self.normalize(pixels),
            target=labels.to(self.device),
            method=method,
            **method_options(method, seed),
        )
        maps = explanation.heatmap(tuple(pixels.shape[-2:])).cpu()
        rows = torch.arange(len(examples))
        clean = self.probabilities(explanation.logits.detach().cpu())
        records: Records = {
            "label": labels.tolist(),
            "other_label": others.tolist(),
            "target_probability": clean[rows, labels].tolist(),
            "other_probability": clean[rows, others].tolist(),
        }
        for sign in ("positive", "negative"):
            copies = perturbed_copies(pixels, removal_order(maps, sign == "positive"), FRACTIONS)
            logits = self.logits(copies.flatten(0, 1)).view(len(FRACTIONS), len(examples), -1)
            probabilities = self.probabilities(logits)  # (F, B, classes)
            records[sign] = probabilities[:, rows, labels].T.tolist()
            if sign == "positive":
                records["other_positive"] = probabilities[:, rows, others].T.tolist()
        counts = [
            segmentation_counts(heatmap, example.mask.cpu().long())
            for heatmap, example in zip(maps, examples, strict=True)
        ]
        records.update(counts_to_records(counts))
        records["denser_on_target"] = [
            int(heatmap[example.mask.bool()].mean() > heatmap[example.other_mask.bool()].mean())
            for heatmap, example in zip(maps, examples, strict=True)
        ]
        return records

    def terms(self, records: Records) -> dict[str, Tensor]:
        terms = {
            key: as_terms(records[key])
            for key in ("target_probability", "other_probability", "denser_on_target")
        }
        for curve in _CURVES:
            rows = torch.tensor(records[curve], dtype=torch.float64).reshape(-1, len(FRACTIONS))
            terms.update({f"{curve}@{i}": rows[:, i] for i in range(len(FRACTIONS))})
        return {**terms, **segmentation_terms(records)}

    def from_sums(self, sums: Mapping[str, Tensor], count: int) -> dict[str, Tensor]:
        segmentation = segmentation_from_sums(sums, count)
        auc = {
            curve: perturbation_auc(_curve(sums, curve, count), auc_range=self.auc_range)
            for curve in _CURVES
        }
        return {
            "positive_auc": auc["positive"],
            "negative_auc": auc["negative"],
            "other_kept_auc": auc["other_positive"],
            "pixel_accuracy": segmentation["pixel_accuracy"],
            "miou": segmentation["miou"],
            "map": segmentation["map"],
            "denser_on_target": sums["denser_on_target"] / count,
        }

    def summarize(self, records: Records) -> dict[str, Any]:
        sums, count = self.summed(records)
        curves: dict[str, list[float]] = {"fractions": [0.0, *FRACTIONS]}
        for curve in _CURVES:
            curves[curve] = [float(value) for value in _curve(sums, curve, count)]
        return {
            "target_probability": curves["positive"][0],
            **self.totals(sums, count),
            "curves": curves,
        }


def _curve(sums: Mapping[str, Tensor], curve: str, count: int) -> list[Tensor]:
    """The mean probability at x = 0 and after each fraction, from sums of `terms`."""
    start = sums[f"{_CURVES[curve]}_probability"] / count
    return [start, *(sums[f"{curve}@{i}"] / count for i in range(len(FRACTIONS)))]
