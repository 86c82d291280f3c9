"""Evaluation datasets: examples with ground truth (labels, masks, rationales).

Real data for users who have it (`ImageNetFolder`, `ImageNetSegmentation`,
`EraserMovies`), a language model's own prompts with known evidence (`AnswerFile`, built
from text by `answer_example` and `write_answer_file`) and the zoo models' own held-out
sets (`heldout_dataset`).
"""

from explain.evaluation.datasets.answers import AnswerFile, answer_example, write_answer_file
from explain.evaluation.datasets.base import (
    AnswerExample,
    EvaluationDataset,
    ImageAnswerExample,
    ImageExample,
    TextExample,
    TwoObjectExample,
)
from explain.evaluation.datasets.eraser import EraserMovies
from explain.evaluation.datasets.imagenet import ImageNetFolder
from explain.evaluation.datasets.imagenet_segmentation import ImageNetSegmentation

__all__ = [
    "AnswerExample",
    "AnswerFile",
    "EraserMovies",
    "EvaluationDataset",
    "ImageAnswerExample",
    "ImageExample",
    "ImageNetFolder",
    "ImageNetSegmentation",
    "TextExample",
    "TwoObjectExample",
    "answer_example",
    "write_answer_file",
]
