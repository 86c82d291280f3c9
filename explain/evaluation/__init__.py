"""Judging explanations by numbers, with the protocols of Chefer et al. (docs/results.md).

- `PerturbationTest`: accuracy as the most (positive) or least (negative) relevant pixels
  are removed; AUC over the removed fraction.
- `SegmentationTest`: the thresholded map as a foreground mask: pixel accuracy, mIoU, mAP.
- `ClassSpecificTest`: two objects of different classes per image, each explained on its
  own: its class's probability as its most or least relevant pixels go, and its mask
  against the other object's.
- `RationaleTest`: the top-k words as a rationale: token precision, recall, F1.
- `ROADTest`: accuracy as the most (MoRF) or least (LeRF) relevant pixels are imputed
  from their neighbours (noisy linear imputation, ROAD), not zeroed.
- `SaCoTest`: whether groups of pixels ranked more relevant change the prediction more
  (the salience-guided faithfulness coefficient).
- `LanguageEvidenceTest`: a language model's answer against its known evidence: evidence
  recall, ERASER comprehensiveness and sufficiency, the answer's log-probability as the
  most or least relevant tokens are replaced.
- `VisionLanguageEvidenceTest`: a vision-language model's answer against the object it is
  about: pointing game, mIoU, the answer's log-probability as patches are removed, and
  the question's evidence words on the text side.
- `run_evaluation`: any of them over a dataset, chunked, resumable and shardable over
  torchrun's processes, writing JSON, a markdown table and a PNG; every ranking number
  with a bootstrap standard error and the methods within noise of the best
  (`explain.evaluation.bootstrap`).
- `explain.evaluation.datasets`: the zoo's held-out sets and loaders for the real data.
- `heldout_accuracy`: a zoo model's accuracy on its held-out split, as its card quotes it.
- `explain.evaluation.quantus.explain_func`: the methods behind Quantus's `explain_func`
  convention, for Quantus's metrics (imported on its own; Quantus is an extra).
- `explain.evaluation.shapes_answers`: a vision-language model's answers to the shapes
  questions, and the check that they rest on the objects the examples record.
"""

from explain.evaluation.accuracy import Accuracy, heldout_accuracy
from explain.evaluation.class_specific import ClassSpecificTest
from explain.evaluation.evidence import RECALL_K, evidence_recall, pointing_hit
from explain.evaluation.language import ERASER_FRACTIONS, LanguageEvidenceTest
from explain.evaluation.perturbation import (
    AUC_RANGES,
    FRACTIONS,
    PerturbationTest,
    perturbation_auc,
)
from explain.evaluation.protocol import Column, EvaluationProtocol, ImageProtocol
from explain.evaluation.rationale import TOP_K, RationaleTest, rationale_scores, word_scores
from explain.evaluation.road import ROADTest, linear_imputation
from explain.evaluation.runner import run_evaluation
from explain.evaluation.saco import SaCoTest, saco
from explain.evaluation.segmentation import (
    SegmentationTest,
    average_precision,
    segmentation_counts,
    segmentation_summary,
)
from explain.evaluation.vision_language import VisionLanguageEvidenceTest

PROTOCOLS: dict[str, type[EvaluationProtocol]] = {
    protocol.name: protocol
    for protocol in (
        PerturbationTest,
        SegmentationTest,
        ClassSpecificTest,
        ROADTest,
        SaCoTest,
        RationaleTest,
        LanguageEvidenceTest,
        VisionLanguageEvidenceTest,
    )
}
"""Every protocol by its command-line name."""

__all__ = [
    "AUC_RANGES",
    "ERASER_FRACTIONS",
    "FRACTIONS",
    "PROTOCOLS",
    "RECALL_K",
    "TOP_K",
    "Accuracy",
    "ClassSpecificTest",
    "Column",
    "EvaluationProtocol",
    "ImageProtocol",
    "LanguageEvidenceTest",
    "PerturbationTest",
    "ROADTest",
    "RationaleTest",
    "SaCoTest",
    "SegmentationTest",
    "VisionLanguageEvidenceTest",
    "average_precision",
    "evidence_recall",
    "heldout_accuracy",
    "linear_imputation",
    "perturbation_auc",
    "pointing_hit",
    "rationale_scores",
    "run_evaluation",
    "saco",
    "segmentation_counts",
    "segmentation_summary",
    "word_scores",
]
