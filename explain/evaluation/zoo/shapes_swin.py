"""shapes-swin: a Swin Transformer naming the kinds of shape in the synthetic scenes
(multi-label), on shapes-vit's task, measure and held-out sets."""

import dataclasses

from explain.evaluation.zoo import shapes_vit

MODEL = dataclasses.replace(shapes_vit.MODEL, name="shapes-swin")
