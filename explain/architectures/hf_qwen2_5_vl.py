"""Hugging Face `Qwen2_5_VLForConditionalGeneration`: Qwen2-VL's layout (flattened patches
merged 2 x 2 into image tokens, multimodal rotary positions; explain.architectures.hf_qwen2_vl)
with a tower that attends within windows in most blocks and over each whole image in its
`fullatt_block_indexes`: the merged blocks are reordered window by window before the
first block (windows of `window_size` pixels, row-major; those at the grid's right and
bottom edges smaller where the grid is no whole number of windows; the blocks row-major
inside a window) and put back in raster block order after the merger. Image token j of
the text is block j of the merged grid, as in Qwen2-VL, and maps back onto the patches
alike, through the tower's window order (`block_order`, the model's own window index).

Depth "tower": as in Qwen2-VL, each block is recorded per image in the tower's order, a
windowed block with its windows' lengths (`Pieces`): a fold by spreads takes it window by
window, one that needs whole maps gets one dense map per image, zero across its windows
(what the model attends); the same fold runs over every block, windowed or not.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from explain.architectures.hf_common import is_transformers_class
from explain.architectures.hf_qwen2_vl import HFQwen2VL

__all__ = ["HFQwen2_5VL"]


class HFQwen2_5VL(HFQwen2VL):
    family = (
        "Hugging Face Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration: 2 x 2 merged patches, "
        "windowed tower, multimodal rotary positions; the next token and generated answers, "
        "over the image and the prompt; depths 'lm' and 'tower')"
    )

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_transformers_class(model, "qwen2_5_vl", ("Qwen2_5_VLForConditionalGeneration",))

    def block_order(self, grid: tuple[int, int]) -> Tensor:
        """The merged block at each of the tower's block positions: window by window, as
        the tower's own window index reorders them."""
        from transformers.vision_utils import get_vision_window_index

        config = self.tower.config
        index, _ = get_vision_window_index(
            torch.tensor([[1, *grid]]),
            spatial_merge_size=int(config.spatial_merge_size),
            window_size=int(config.window_size),
            patch_size=int(config.patch_size),
        )
        return index
