"""shapes-swin: a Swin Transformer naming the kinds of shape in the synthetic scenes
(multi-label), on shapes-vit's task and held-out sets."""

from explain.evaluation.accuracy import shapes_accuracy
from explain.evaluation.datasets.zoo import ShapesHeldout, ShapesPairs
from explain.evaluation.zoo import ZooEvaluation

MODEL = ZooEvaluation(
    name="shapes-swin",
    headline="every kind's present/absent decision right (the exact set of kinds)",
    accuracy=shapes_accuracy,
    count=2000,
    check=(60, 0.08),
    heldout=lambda size: ShapesHeldout(size=size[0] if size else 64),
    two_objects=lambda size: ShapesPairs(size=size[0] if size else 64),
)
