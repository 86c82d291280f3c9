"""Folding the readout row through windowed attention and patch merging (Swin).

A windowed block's attention over its grid of N tokens is block-diagonal once the tokens
are put in window order: roll the grid by the block's cyclic shift, cut it into windows,
and every token attends only to the tokens of its own window. With `P` that permutation
and `A_w` the per-window matrices the block recorded, the block's (N, N) matrix is
`P^T diag(A_w) P`, so one factor of the fold,

    v <- v @ (I + Abar)   (generic),   v <- v @ (I + Abar) / rowsum   (rollout),

is the same step applied window by window to `v` in window order, then put back: no
(N, N) matrix is ever built, and a block costs O(N w) for windows of w tokens instead of
O(N^2). Between stages a patch merging turns each 2 x 2 group of tokens into one token;
the rule carries relevance through it as a fixed linear map, the transpose of the 2 x 2
mean: each merged token's relevance is split equally over the four tokens it was made of.
The fold ends on the input patch grid. docs/methods.md derives the rule.
"""

from __future__ import annotations

import torch
from torch import Tensor

from explain.architectures.windows import WindowedBlock, WindowedLayout
from explain.rules.fold import BlockMatrix, ReadoutFold, Step

__all__ = ["WindowedFold", "from_windows", "to_windows", "unmerge"]


def to_windows(vector: Tensor, block: WindowedBlock) -> Tensor:
    """(B, N) over `block`'s grid -> (B * windows, w) in the order the block's attention
    sees its tokens: the grid rolled by -shift, then cut into windows (batch-major, then
    windows row-major, then tokens row-major inside a window)."""
    batch = vector.shape[0]
    (rows, columns), (wr, wc) = block.grid, block.window
    grid = vector.reshape(batch, rows, columns)
    if any(block.shift):
        grid = torch.roll(grid, shifts=(-block.shift[0], -block.shift[1]), dims=(1, 2))
    windows = grid.reshape(batch, rows // wr, wr, columns // wc, wc).permute(0, 1, 3, 2, 4)
    return windows.reshape(batch * block.num_windows, block.window_tokens)


def from_windows(windows: Tensor, block: WindowedBlock) -> Tensor:
    """The inverse of `to_windows`: (B * windows, w) -> (B, N) over `block`'s grid."""
    (rows, columns), (wr, wc) = block.grid, block.window
    batch = windows.shape[0] // block.num_windows
    grid = windows.reshape(batch, rows // wr, columns // wc, wr, wc).permute(0, 1, 3, 2, 4)
    grid = grid.reshape(batch, rows, columns)
    if any(block.shift):
        grid = torch.roll(grid, shifts=block.shift, dims=(1, 2))
    return grid.reshape(batch, rows * columns)


def unmerge(vector: Tensor, grid: tuple[int, int]) -> Tensor:
    """(B, N / 4) over the merged grid -> (B, N) over the (rows, columns) `grid` before
    the merge: each merged token's value split equally over its 2 x 2 tokens (the
    transpose of the 2 x 2 mean, which keeps the row's total)."""
    batch = vector.shape[0]
    merged = vector.reshape(batch, grid[0] // 2, grid[1] // 2)
    spread = merged.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2) / 4
    return spread.reshape(batch, grid[0] * grid[1])


class WindowedFold(ReadoutFold):
    """`readout @ M_last ... M_first` for a windowed model, `readout` (B, N_last) over the
    last block's grid; the result (B, N_0) is over the input patch grid.

    Each block's records arrive as per-window tensors (B * windows, H, w, w);
    `block_matrix` reduces them to (B * windows, w, w) as for any other model (the rules
    are elementwise over tokens), and `step` is the method's usual fold step, applied in
    window order. Blocks arrive and are folded as in `ReadoutFold` (whose ordering this
    reuses), and the patch mergings between are undone on the way down.
    """

    def __init__(
        self,
        readout: Tensor,
        layout: WindowedLayout,
        layers: range,
        block_matrix: BlockMatrix,
        step: Step,
    ) -> None:
        super().__init__(readout, layers, block_matrix, step)
        self._blocks = layout.blocks
        self._grid = self._blocks[-1].grid

    def _fold(self, layer: int, matrix: Tensor) -> None:
        block = self._blocks[layer]
        self._descend(block.grid)
        folded = self._step(to_windows(self._vector.to(matrix.dtype), block), matrix)
        self._vector = from_windows(folded, block)

    def _descend(self, grid: tuple[int, int]) -> None:
        """Undo the patch mergings between the vector's grid and the larger `grid`."""
        while self._grid != grid:
            self._grid = (2 * self._grid[0], 2 * self._grid[1])
            self._vector = unmerge(self._vector, self._grid)

    def result(self) -> Tensor:
        super().result()  # raises unless every block has been folded
        self._descend(self._blocks[0].grid)
        return self._vector
