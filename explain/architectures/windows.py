"""The token geometry of windowed, hierarchical vision transformers (Swin).

Such a model runs its blocks on a grid of tokens that shrinks from stage to stage: each
block attends within square windows of its grid, after rolling the grid by a cyclic shift
(every other block), and a patch merging between stages turns each 2 x 2 group of tokens
into one. A block's attention is therefore recorded per window, (B * windows, H, w, w)
with w the tokens of a window, never as one (N, N) matrix over the grid.

`WindowedLayout` is the `TokenLayout` of such a model: the input patch grid (where
relevance is returned) plus, per block, its grid, window and shift (`WindowedBlock`). The
rules (explain.rules.windowed) fold the readout row through exactly this description;
the adapters (explain.architectures.timm_swin, hf_swin) read it off the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from explain.architectures.base import TokenLayout
from explain.errors import InputError

__all__ = ["WINDOWED_METHODS", "WindowedBlock", "WindowedLayout", "windowed_layout"]

WINDOWED_METHODS = frozenset({"generic", "rollout", "raw_attention", "random"})
"""The methods whose rules fold windowed attention (explain.rules.windowed), and the
random baseline: a windowed family's `Adapter.methods`."""


@dataclass(frozen=True)
class WindowedBlock:
    """One block's view of its stage: a `grid` (rows, columns) of tokens in row-major
    order, cut into windows of `window` (rows, columns) tokens after rolling the grid by
    `-shift` (the cyclic shift, undone after the attention). Windows are numbered
    row-major over the grid, tokens row-major inside a window, as timm and transformers
    both partition them."""

    grid: tuple[int, int]
    window: tuple[int, int]
    shift: tuple[int, int]

    @property
    def num_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def num_windows(self) -> int:
        return (self.grid[0] // self.window[0]) * (self.grid[1] // self.window[1])

    @property
    def window_tokens(self) -> int:
        return self.window[0] * self.window[1]


@dataclass(frozen=True)
class WindowedLayout(TokenLayout):
    """A hierarchical image model's layout: the input patch grid (`grid`, no prefix
    tokens) and every block's `WindowedBlock` in forward order. Between two consecutive
    blocks whose grids differ sits a patch merging (each grid half the size of the one
    before); the readout row is over the last block's grid."""

    blocks: tuple[WindowedBlock, ...] = ()

    @property
    def readout_tokens(self) -> int:
        """The tokens the head reads: those of the last block's grid."""
        return self.blocks[-1].num_tokens


def windowed_layout(
    blocks: list[WindowedBlock], input_size: tuple[int, int], family: str
) -> WindowedLayout:
    """The layout of `blocks` for an input of `input_size` pixels, checked: every grid a
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
    return WindowedLayout(
        modality="image",
        num_tokens=first[0] * first[1],
        num_prefix_tokens=0,
        grid=first,
        input_size=(int(input_size[0]), int(input_size[1])),
        blocks=tuple(blocks),
    )
