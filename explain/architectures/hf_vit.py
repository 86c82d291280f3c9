"""Hugging Face image classifiers: ViTForImageClassification, DeiTForImageClassification
and DeiTForImageClassificationWithTeacher.

The head reads the class token (ViT, DeiT) or, with the teacher head, averages the
class-token and distillation-token heads in eval mode, so the readout row is one-hot at
token 0 or 1/2 at tokens 0 and 1. Relevance is returned over the patch grid, prefix tokens
dropped, as for timm models.
"""

from __future__ import annotations

from torch import Tensor, nn

from explain.architectures.base import mean_rows, validate_image_batch
from explain.architectures.hf_common import (
    HFAdapter,
    is_transformers_class,
    num_prefix_tokens,
)
from explain.errors import InputError
from explain.layout import Prepared, TokenLayout

__all__ = ["HFViT"]

_WITH_TEACHER = "DeiTForImageClassificationWithTeacher"


class HFViT(HFAdapter):
    family = (
        "Hugging Face ViTForImageClassification, DeiTForImageClassification and "
        "DeiTForImageClassificationWithTeacher"
    )

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self._teacher = is_transformers_class(model, "deit", (_WITH_TEACHER,))
        self._prefix = num_prefix_tokens(model)

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_transformers_class(
            model, "vit", ("ViTForImageClassification",)
        ) or is_transformers_class(
            model, "deit", ("DeiTForImageClassification", "DeiTForImageClassificationWithTeacher")
        )

    def prepare(self, inputs: object) -> Prepared:
        config = self.model.config
        images = validate_image_batch(inputs, config.num_channels, self.parameter)
        height, width = images.shape[-2:]
        size = config.image_size
        if (height, width) != (size, size):
            raise InputError(
                f"this model takes {size}x{size} images, got {height}x{width}; resize the input"
            )
        grid = (size // config.patch_size, size // config.patch_size)
        layout = TokenLayout.image(grid, (height, width), self._prefix)
        return Prepared(
            batch_size=images.shape[0], layout=layout, arguments={"pixel_values": images}
        )

    def forward(self, prepared: Prepared) -> Tensor:
        return self.model(**prepared.arguments).logits

    def readout(self, prepared: Prepared) -> Tensor:
        # With the teacher head, the eval-mode head averages the class and distillation heads.
        heads = range(2) if self._teacher else range(1)
        return mean_rows(prepared.batch_size, prepared.layout.num_tokens, heads, self.parameter)
