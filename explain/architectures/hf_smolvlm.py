"""Hugging Face `SmolVLMForConditionalGeneration`: Idefics3's layout (photos split into
tiles and a global image, each tile's patches pixel-shuffled into image tokens, the tile
layout read from the text; explain.architectures.hf_idefics3), usually with a larger
shuffle (4 x 4 patches per image token) and a smaller language model. Its image tokens
map back onto the photo as Idefics3's do.
"""

from __future__ import annotations

from torch import nn

from explain.architectures.hf_common import is_transformers_class
from explain.architectures.hf_idefics3 import HFIdefics3

__all__ = ["HFSmolVLM"]


class HFSmolVLM(HFIdefics3):
    family = (
        "Hugging Face SmolVLM (SmolVLMForConditionalGeneration: photos split into tiles and "
        "a global image, SigLIP tower, pixel-shuffled image tokens; the next token and "
        "generated answers, over the photo and the prompt)"
    )

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_transformers_class(model, "smolvlm", ("SmolVLMForConditionalGeneration",))
