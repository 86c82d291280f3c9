"""Evaluation datasets: examples with ground truth (labels, masks, rationales).

Real data for users who have it (`ImageNetFolder`, `ImageNetSegmentation`,
`EraserMovies`) and the zoo models' own held-out sets (`heldout_dataset`).
"""

from explain.evaluation.datasets.base import (
    EvaluationDataset,
    ImageExample,
    TextExample,
    TwoObjectExample,
)
from explain.evaluation.datasets.eraser import EraserMovies
from explain.evaluation.datasets.imagenet import ImageNetFolder
from explain.evaluation.datasets.imagenet_segmentation import ImageNetSegmentation

__all__ = [
    "EraserMovies",
    "EvaluationDataset",
    "ImageExample",
    "ImageNetFolder",
    "ImageNetSegmentation",
    "TextExample",
    "TwoObjectExample",
]
