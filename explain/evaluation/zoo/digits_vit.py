"""digits-vit: a ViT reading scikit-learn's handwritten digits."""

from explain.evaluation.accuracy import digits_accuracy
from explain.evaluation.datasets.zoo import DigitsHeldout
from explain.evaluation.zoo import ZooEvaluation

MODEL = ZooEvaluation(
    name="digits-vit",
    headline="top-1",
    accuracy=digits_accuracy,
    count=400,
    check=(400, 0.005),  # cheap enough to check on all of its held-out digits
    heldout=lambda size: DigitsHeldout(size=size[0] if size else 32),
)
