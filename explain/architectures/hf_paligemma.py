"""Hugging Face `PaliGemmaForConditionalGeneration`: a SigLIP vision tower read at its
last layer, a linear projector that maps each tower token to one image token, and a Gemma
language model that attends over the image-and-prompt prefix in both directions (token
type 0) and over the answer causally (token type 1).

The image tokens come first in the text, one per patch of the tower (SigLIP has no class
token). Nothing in the prefix attends to the answer, so one forward over prompt and answer
gives every answer token the maps a next-token explanation of its prefix would. PaliGemma
counts its positions from 1, as its own forward and generation do.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from explain.architectures.hf_common import is_transformers_class
from explain.architectures.hf_vision_language import VisionLanguageModel
from explain.layout import ImageTokens

__all__ = ["HFPaliGemma"]


class HFPaliGemma(VisionLanguageModel):
    family = (
        "Hugging Face PaliGemma (PaliGemmaForConditionalGeneration: SigLIP tower, Gemma "
        "language model with a bidirectional image-and-prompt prefix; the next token and "
        "generated answers, over the image and the prompt)"
    )
    token_types = True

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_transformers_class(model, "paligemma", ("PaliGemmaForConditionalGeneration",))

    def image_tokens(self, arguments: Mapping[str, Tensor]) -> ImageTokens:
        pixel_values = arguments["pixel_values"]
        patch = self.tower.config.patch_size
        grid = (pixel_values.shape[-2] // patch, pixel_values.shape[-1] // patch)
        sources = torch.arange(grid[0] * grid[1], device=pixel_values.device)[:, None]
        size = (pixel_values.shape[-2], pixel_values.shape[-1])
        return ImageTokens(grid=grid, tower_prefix=0, sources=sources, input_size=size)

    def position_ids(self, arguments: Mapping[str, Tensor], tokens: ImageTokens) -> Tensor:
        """Each text's real tokens counted from 1, as PaliGemma's own forward and generation
        count them (its rotary embedding is relative, but computed in float32 from the
        absolute positions: other positions round differently)."""
        return super().position_ids(arguments, tokens) + 1

    def continued(self, extra: Mapping[str, Tensor], count: int) -> dict[str, Tensor]:
        """The answer's tokens are of type 1 (causal), as PaliGemma's generation sets them."""
        extended = dict(extra)
        types = extra.get("token_type_ids")
        if types is not None:
            extended["token_type_ids"] = torch.cat(
                [types, types.new_ones(types.shape[0], count)], 1
            )
        return extended
