"""shapes-llava: a LLaVA answering templated questions about the synthetic scenes, each
answer's object known (its mask)."""

from explain.evaluation import shapes_answers
from explain.evaluation.datasets.base import EvaluationDataset
from explain.evaluation.datasets.zoo import ShapesAnswers
from explain.evaluation.zoo import ZooEvaluation
from explain.loading.loaded_model import LoadedModel


def _answers(loaded: LoadedModel, length: int | None) -> EvaluationDataset:
    """The held-out questions (`ShapesAnswers`), drawn at the processor's image size: the
    answer word's token, the mask of the object the answer is about (empty for "no",
    "none", "nothing": such examples are left out of the pointing game and the mIoU, and
    counted), the word the question names as text evidence. `length` is a language
    model's, so unused."""
    size = loaded.image_size
    return ShapesAnswers(loaded.tokenizer, size=size[0] if size else 64)


MODEL = ZooEvaluation(
    name="shapes-llava",
    headline="the first answer word (greedy) is the true answer",
    accuracy=shapes_answers.question_accuracy,
    count=1000,
    check=(80, 0.08),  # its own floor is in tests/test_zoo_llava.py
    answers=_answers,
    evidence_check=shapes_answers.evidence_check,
)
