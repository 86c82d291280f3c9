"""The token geometry of windowed, hierarchical vision transformers (Swin).

Such a model runs its blocks on a grid of tokens that shrinks from stage to stage: each
block attends within square windows of its grid, after rolling the grid by a cyclic shift
(every other block), and a patch merging between stages turns each 2 x 2 group of tokens
into one. A block's attention is therefore recorded per window, (B * windows, H, w, w)
with w the tokens of a window, never as one (N, N) matrix over the grid.

The `TokenLayout` of such a model holds the input patch grid (where relevance is
returned) and, per block, its grid, window and shift (`TokenLayout.windows`, each an
explain.layout.WindowedBlock). The rules fold the readout row through exactly this
description (explain.rules.fold); the adapters (explain.architectures.timm_swin,
hf_swin) read it off the model with `windowed_layout`.
"""

from __future__ import annotations

from itertools import pairwise

from explain.errors import InputError
from explain.layout import TokenLayout, WindowedBlock

__all__ = ["WINDOWED_METHODS", "windowed_layout"]

WINDOWED_METHODS = frozenset({"generic", "rollout", "raw_attention", "attention_gradcam", "random"})
"""The methods whose rules read windowed attention (explain.rules.fold: the folds, and
attention GradCAM on a last stage of one window), and the random baseline: a windowed
family's `Adapter.methods`."""


def windowed_layout(
    blocks: list[WindowedBlock], input_size: tuple[int, int], family: str
) -> TokenLayout:
    """The windowed layout of `blocks` for an input of `input_size` pixels, checked: every grid a
    whole number of windows, and every change of grid a 2 x 2 merge. `family` names the
    model in the errors."""
    for index, block in enumerate(blocks):
        rows, columns = block.grid
        if rows % block.window[0] or columns % block.window[1]:
            raise InputError(
                f"{family}: block {index} runs on a {rows}x{columns} token grid, which its "
                f"{block.window[0]}x{block.window[1]} windows do not tile (the model would "
                "pad it); give an image whose size the model was built for"
            )
    for index, (before, after) in enumerate(pairwise(blocks), start=1):
        if before.grid != after.grid and before.grid != (2 * after.grid[0], 2 * after.grid[1]):
            raise InputError(
                f"{family}: the token grid goes from {before.grid} to {after.grid} before "
                f"block {index}, which is not a 2 x 2 patch merging of an even grid; give "
                "an image whose size the model was built for"
            )
    first = blocks[0].grid
    return TokenLayout(
        modality="image",
        num_tokens=first[0] * first[1],
        grid=first,
        input_size=(int(input_size[0]), int(input_size[1])),
        windows=tuple(blocks),
    )
