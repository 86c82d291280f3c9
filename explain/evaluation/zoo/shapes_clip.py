"""shapes-clip: a CLIP matching the synthetic scenes with their captions (zero-shot
retrieval of the set of kinds)."""

from explain.evaluation.accuracy import retrieval_accuracy
from explain.evaluation.zoo import ZooEvaluation

MODEL = ZooEvaluation(
    name="shapes-clip",
    headline="zero-shot: the closest of the 41 set captions names exactly its kinds",
    accuracy=retrieval_accuracy,
    count=1000,
    # It retrieves the exact set of all of the first 50 held-out scenes; the margin allows
    # three misses among them.
    check=(50, 0.06),
)
