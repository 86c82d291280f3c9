"""Hugging Face image classifiers: ViTForImageClassification, DeiTForImageClassification
and DeiTForImageClassificationWithTeacher.

The head reads the class token (ViT, DeiT) or, with the teacher head, averages the
class-token and distillation-token heads in eval mode, so the readout row is one-hot at
token 0 or 1/2 at tokens 0 and 1. Relevance is returned over the patch grid, prefix tokens
dropped, as for timm models.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from explain.architectures import register_adapter
from explain.architectures.base import Prepared, TokenLayout
from explain.architectures.hf_common import HuggingFaceAdapter, is_transformers_class
from explain.architectures.timm_vit import validate_image_batch
from explain.errors import InputError

__all__ = ["HuggingFaceViT"]

_WITH_TEACHER = "DeiTForImageClassificationWithTeacher"


@register_adapter
class HuggingFaceViT(HuggingFaceAdapter):
    family = (
        "Hugging Face ViTForImageClassification, DeiTForImageClassification and "
        "DeiTForImageClassificationWithTeacher"
    )

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self._teacher = is_transformers_class(model, "deit", (_WITH_TEACHER,))
        self._prefix = 2 if is_transformers_class(model, "deit", ("DeiTPreTrainedModel",)) else 1

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
        layout = TokenLayout(
            modality="image",
            num_tokens=self._prefix + grid[0] * grid[1],
            num_prefix_tokens=self._prefix,
            grid=grid,
            input_size=(height, width),
        )
        return Prepared(
            batch_size=images.shape[0], layout=layout, arguments={"pixel_values": images}
        )

    def forward(self, prepared: Prepared) -> Tensor:
        return self.model(**prepared.arguments).logits

    def readout(self, prepared: Prepared) -> Tensor:
        parameter = self.parameter
        row = torch.zeros(
            prepared.batch_size,
            prepared.layout.num_tokens,
            device=parameter.device,
            dtype=parameter.dtype,
        )
        if self._teacher:  # the eval-mode head averages the class and distillation heads
            row[:, :2] = 0.5
        else:
            row[:, 0] = 1.0
        return row

    def to_input_space(self, token_relevance: Tensor, layout: TokenLayout) -> Tensor:
        return layout.patch_grid(token_relevance)
