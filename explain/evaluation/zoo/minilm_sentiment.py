"""minilm-sentiment: a MiniLM BERT encoder with a sentiment head, on the synthetic
sentences whose deciding words are known."""

from explain.evaluation.accuracy import sentiment_accuracy
from explain.evaluation.datasets.zoo import SentimentHeldout
from explain.evaluation.zoo import ZooEvaluation

MODEL = ZooEvaluation(
    name="minilm-sentiment",
    headline="top-1",
    accuracy=sentiment_accuracy,
    count=1000,
    check=(60, 0.05),
    heldout=lambda size: SentimentHeldout(),
)
