"""Hugging Face `LlavaForConditionalGeneration`: a CLIP or SigLIP vision tower, read at
one inner layer (or several, concatenated), a projector that maps each tower token to one
image token, and a Llama, Mistral, Qwen2 or other decoder-only language model.

The projector works token by token, so image token j of the text is tower token j (with
strategy "default" the class token is dropped first: image token j is tower token j + 1).
The tower's blocks after the deepest layer it is read at never reach the language model
and are left out of the stack.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from explain.architectures.hf_common import is_transformers_class
from explain.architectures.hf_vision_language import VisionLanguageModel
from explain.errors import InputError, UnsupportedModelError
from explain.layout import ImageTokens

__all__ = ["HFLlava"]


class HFLlava(VisionLanguageModel):
    family = (
        "Hugging Face LLaVA (LlavaForConditionalGeneration: CLIP or SigLIP tower, Llama, "
        "Mistral or Qwen2 language model; the next token and generated answers, over the "
        "image and the prompt)"
    )

    def __init__(self, model: nn.Module) -> None:
        config = model.config
        if getattr(config, "vision_feature_select_strategy", "default") not in ("default", "full"):
            raise UnsupportedModelError(
                f"LLaVA with vision_feature_select_strategy="
                f"{config.vision_feature_select_strategy!r} is not supported ('default', 'full')"
            )
        super().__init__(model)

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_transformers_class(model, "llava", ("LlavaForConditionalGeneration",))

    def tower_depth(self, num_blocks: int) -> int:
        """Hidden state h (0: the embeddings, h: block h - 1's output) is read: blocks
        0..h-1 feed the language model; with several layers, up to the deepest."""
        layers = self.model.config.vision_feature_layer
        layers = [layers] if isinstance(layers, int) else list(layers)
        return max(layer % (num_blocks + 1) for layer in layers)

    def image_tokens(self, arguments: Mapping[str, Tensor]) -> ImageTokens:
        pixel_values = arguments["pixel_values"]
        patch = self.tower.config.patch_size
        expected = self.tower.config.image_size  # the tower's position table is this size's
        if tuple(pixel_values.shape[-2:]) != (expected, expected):
            raise InputError(
                f"LLaVA's vision tower takes {expected} x {expected} pixels, got "
                f"{pixel_values.shape[-2]} x {pixel_values.shape[-1]}: resize the image with "
                "the model's processor"
            )
        grid = (pixel_values.shape[-2] // patch, pixel_values.shape[-1] // patch)
        prefix = 1 if hasattr(self.tower.embeddings, "class_embedding") else 0
        tower_tokens = prefix + grid[0] * grid[1]
        # "default" drops the tower's first token (the class token where there is one)
        dropped = 1 if self.model.config.vision_feature_select_strategy == "default" else 0
        sources = torch.arange(dropped, tower_tokens, device=pixel_values.device)[:, None]
        size = (pixel_values.shape[-2], pixel_values.shape[-1])
        return ImageTokens(grid=grid, tower_prefix=prefix, sources=sources, input_size=size)
