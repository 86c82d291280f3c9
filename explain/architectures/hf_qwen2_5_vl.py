"""Hugging Face `Qwen2_5_VLForConditionalGeneration`: Qwen2-VL's layout (flattened patches
merged 2 x 2 into image tokens, multimodal rotary positions; explain.architectures.hf_qwen2_vl)
with a tower that attends within windows in most blocks, the patches reordered window by
window and put back in raster block order after the merger. Image token j of the text is
block j of the merged grid, as in Qwen2-VL, and maps back onto the patches alike.

Depth "tower" is refused: besides the packed sequence, the windowed blocks' maps would
have to be folded within windows, in the order the model's window index puts the patches.
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from explain.architectures.hf_common import is_transformers_class
from explain.architectures.hf_qwen2_vl import HFQwen2VL

__all__ = ["HFQwen2_5VL"]


class HFQwen2_5VL(HFQwen2VL):
    family = (
        "Hugging Face Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration: 2 x 2 merged patches, "
        "windowed tower, multimodal rotary positions; the next token and generated answers, "
        "over the image and the prompt; depth 'lm')"
    )
    tower_refused: ClassVar[str | None] = (
        "its vision tower runs every image's patches as one unbatched packed sequence, "
        "attending within windows in most blocks (windowed attention in a reordered "
        "sequence), whose maps the tower's fold does not read yet"
    )

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_transformers_class(model, "qwen2_5_vl", ("Qwen2_5_VLForConditionalGeneration",))
