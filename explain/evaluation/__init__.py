"""Judging explanations by numbers, with the protocols of Chefer et al. (docs/results.md).

- `PerturbationTest`: accuracy as the most (positive) or least (negative) relevant pixels
  are removed; AUC over the removed fraction.
- `SegmentationTest`: the thresholded map as a foreground mask: pixel accuracy, mIoU, mAP.
- `ClassSpecificTest`: two objects of different classes per image, each explained on its
  own: its class's probability as its most or least relevant pixels go, and its mask
  against the other object's.
- `RationaleTest`: the top-k words as a rationale: token precision, recall, F1.
- `run_evaluation`: any of them over a dataset, chunked, resumable and shardable over
  torchrun's processes, writing JSON, a markdown table and a PNG; every ranking number
  with a bootstrap standard error and the methods within noise of the best
  (`explain.evaluation.bootstrap`).
- `explain.evaluation.datasets`: the zoo's held-out sets and loaders for the real data.
- `heldout_accuracy`: a zoo model's accuracy on its held-out split, as its card quotes it.
- `explain.evaluation.shapes_answers`: a vision-language model's answers to the shapes
  questions, and the check that they rest on the objects the examples record.
"""

from explain.evaluation.accuracy import Accuracy, heldout_accuracy
from explain.evaluation.class_specific import ClassSpecificTest
from explain.evaluation.perturbation import (
    AUC_RANGES,
    FRACTIONS,
    PerturbationTest,
    perturbation_auc,
)
from explain.evaluation.protocol import Column, EvaluationProtocol, ImageProtocol
from explain.evaluation.rationale import TOP_K, RationaleTest, rationale_scores, word_scores
from explain.evaluation.runner import run_evaluation
from explain.evaluation.segmentation import (
    SegmentationTest,
    average_precision,
    segmentation_counts,
    segmentation_summary,
)

PROTOCOLS: dict[str, type[EvaluationProtocol]] = {
    protocol.name: protocol
    for protocol in (PerturbationTest, SegmentationTest, ClassSpecificTest, RationaleTest)
}
"""Every protocol by its command-line name."""

__all__ = [
    "AUC_RANGES",
    "FRACTIONS",
    "PROTOCOLS",
    "TOP_K",
    "Accuracy",
    "ClassSpecificTest",
    "Column",
    "EvaluationProtocol",
    "ImageProtocol",
    "PerturbationTest",
    "RationaleTest",
    "SegmentationTest",
    "average_precision",
    "heldout_accuracy",
    "perturbation_auc",
    "rationale_scores",
    "run_evaluation",
    "segmentation_counts",
    "segmentation_summary",
    "word_scores",
]
