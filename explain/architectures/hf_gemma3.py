"""Hugging Face `Gemma3ForConditionalGeneration`: a SigLIP vision tower read at its last
layer, a projector that average-pools the tower's patch grid (p x p) down to s x s image
tokens (`mm_tokens_per_image` = s^2, each the mean of a k x k block of patches, k = p / s),
and a Gemma 3 language model whose image tokens (token type 1) attend to each other in
both directions within their image.

Image token j of the text was made from the k x k patches of its block: its relevance is
shared out equally over them (`ImageTokens.sources`, 1 / k^2 each), back onto the
tower's grid. The answer's tokens are text (token type 0), as Gemma 3's generation has
them.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from explain.architectures.hf_common import is_transformers_class
from explain.architectures.hf_vision_language import VisionLanguageModel, block_sources
from explain.layout import ImageTokens

__all__ = ["HFGemma3"]


class HFGemma3(VisionLanguageModel):
    family = (
        "Hugging Face Gemma 3 (Gemma3ForConditionalGeneration: SigLIP tower, pooled image "
        "tokens, Gemma 3 language model; the next token and generated answers, over the "
        "image and the prompt)"
    )
    token_types = True

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_transformers_class(model, "gemma3", ("Gemma3ForConditionalGeneration",))

    def image_tokens(self, arguments: Mapping[str, Tensor]) -> ImageTokens:
        pixel_values = arguments["pixel_values"]
        patch = self.tower.config.patch_size
        side = pixel_values.shape[-1] // patch  # the projector pools a square grid
        pooled = round(self.model.config.mm_tokens_per_image**0.5)
        kernel = side // pooled
        sources = block_sources((side, side), kernel, pixel_values.device)
        size = (pixel_values.shape[-2], pixel_values.shape[-1])
        return ImageTokens(grid=(side, side), tower_prefix=0, sources=sources, input_size=size)

    def continued(self, extra: Mapping[str, Tensor], count: int) -> dict[str, Tensor]:
        """The answer's tokens are text, of type 0."""
        extended = dict(extra)
        types = extra.get("token_type_ids")
        if types is not None:
            extended["token_type_ids"] = torch.cat(
                [types, types.new_zeros(types.shape[0], count)], 1
            )
        return extended
