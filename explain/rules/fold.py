"""Sinks shared by the rules: folding the readout row, and last-block methods.

Only the readout row of an aggregated matrix M = M_{L-1} ... M_s is ever needed, so it is
folded right to left as vector-matrix products, `v <- step(v, M_l)` for l = L-1 down to
s: O(L N^2) per sample instead of O(L N^3). Block matrices may arrive in any order; each
one is folded as soon as every later block has been, so in the backward pass (last block
first) every block is folded and freed on arrival.

A fold whose block matrix is a head mean of the attention (rollout, raw attention) or of
`(dA * A)+` (generic) can also be folded without any block matrix (`Spread`): its step is written
through the block's spread `u @ Abar`, which explain.engine.kernels computes from q, k,
v and dO without N x N maps. `ColumnFolds` stacks the folds of several columns (classes,
generated tokens) into one (C, B, N) fold, so that one spread per block serves them all.

A method that reads only the last block (`LastBlock`) writes its map for several columns
at once, and `ColumnLastBlocks` stacks the columns of a call into one such map. A windowed
model's blocks (Swin) are folded window by window (`WindowedFold`), and its last block is
read in its one window (`WindowedLastBlock`); `readout_fold` and `last_block` pick what a
layout needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from explain.errors import UnsupportedModelError
from explain.layout import WindowedBlock
from explain.rules.registry import RuleContext

__all__ = [
    "ColumnFolds",
    "ColumnLastBlocks",
    "LastBlock",
    "LastBlockMap",
    "ReadoutFold",
    "Spread",
    "Step",
    "WindowedFold",
    "WindowedLastBlock",
    "compute_dtype",
    "from_windows",
    "last_block",
    "readout_fold",
    "to_windows",
    "unmerge",
    "unmerge_to",
    "vecmat",
]

BlockMatrix = Callable[[Tensor, Tensor | None], Tensor]
Step = Callable[[Tensor, Tensor], Tensor]
"""One factor of the fold: (v (B, N), M_l (B, N, N)) -> the new row vector (B, N)."""


@dataclass(frozen=True)
class Spread:
    """A fold step written through the block's spread (module docstring).

    `mode` names Abar for explain.engine.kernels.readout_spread ("gradient": mean_h
    (dA * A)+, "attention": mean_h A). `split(v, rowsum)` -> (u, kept): the new row vector
    is `kept + u @ Abar`. `rowsum` (B, N) is Abar's row sums where the step needs them
    (rollout's normalisation; only for mode "attention", where a row sums to 1 unless
    every key of it is masked), None where every row sums to 1."""

    mode: Literal["gradient", "attention"]
    split: Callable[[Tensor, Tensor | None], tuple[Tensor, Tensor]]


def compute_dtype(tensor: Tensor) -> torch.dtype:
    """Rules run in the model's dtype, but at least float32 (half precision loses mass)."""
    return tensor.dtype if tensor.dtype in (torch.float32, torch.float64) else torch.float32


def vecmat(vector: Tensor, matrix: Tensor) -> Tensor:
    """Per-sample row vector times matrix: (B, N) x (B, N, M) -> (B, M)."""
    return torch.bmm(vector.unsqueeze(1), matrix).squeeze(1)


class ReadoutFold:
    """Fold `readout @ M_{last} ... M_{first}` over blocks `layers`.

    `block_matrix(attention, gradient)` reduces one block's records to its (B, N, N)
    matrix; `step` applies one factor to the row vector. `spread`, where the method has
    one, folds the same step without block matrices (`Spread`, `ColumnFolds`).
    """

    def __init__(
        self,
        readout: Tensor,
        layers: range,
        block_matrix: BlockMatrix,
        step: Step,
        *,
        spread: Spread | None = None,
    ):
        self.layers = layers
        self.spread = spread
        self._block_matrix = block_matrix
        self._step = step
        self._vector = readout.to(compute_dtype(readout))
        self._next = layers[-1] if len(layers) else None
        self._pending: dict[int, Tensor] = {}

    def add(self, layer: int, attention: Tensor, gradient: Tensor | None) -> None:
        if layer not in self.layers:
            return
        dtype = compute_dtype(attention)
        gradient = gradient.to(dtype) if gradient is not None else None
        self._pending[layer] = self._block_matrix(attention.to(dtype), gradient)
        while self._next is not None and self._next in self._pending:
            self._fold(self._next, self._pending.pop(self._next))
            self._next = self._next - 1 if self._next > self.layers[0] else None

    def _fold(self, layer: int, matrix: Tensor) -> None:
        """Apply block `layer`'s factor to the row vector (every later block is folded)."""
        self._vector = self._step(self._vector.to(matrix.dtype), matrix)

    def result(self) -> Tensor:
        if self._next is not None:
            raise RuntimeError(f"block {self._next} never arrived; cannot finish the fold")
        return self._vector


def readout_fold(
    context: RuleContext,
    layers: range,
    block_matrix: BlockMatrix,
    step: Step,
    *,
    spread: Spread | None = None,
) -> ReadoutFold:
    """The readout fold of `context`'s layout over `layers`: window by window where its
    blocks attend within windows (`TokenLayout.windows`, `WindowedFold`, which has no
    spread), else over every token."""
    if context.layout.windows:
        return WindowedFold(context.readout, context.layout.windows, layers, block_matrix, step)
    return ReadoutFold(context.readout, layers, block_matrix, step, spread=spread)


class ColumnFolds:
    """The readout folds of C columns (one `ReadoutFold` each, the same method and blocks)
    folded together as one (C, B, N) row vector, block by block through spreads: the
    cost of a block does not grow with the number of columns beyond the spread itself.

    `fold(layer, columns, spread, rowsum)` folds block `layer` for the columns `columns`
    (a chunk of the batched backward, or all of them), with `spread(u)` -> u @ Abar for
    the (c, B, N) rows u; blocks arrive last first for each chunk of columns. `finish()`
    hands every column's row vector back to its fold, whose `result()` then reads it.
    """

    def __init__(self, folds: Sequence[ReadoutFold]) -> None:
        first = folds[0]
        if first.spread is None or any(
            f.spread != first.spread or f.layers != first.layers for f in folds
        ):
            raise ValueError("ColumnFolds needs folds of one method over the same blocks")
        self.layers = first.layers
        self.mode = first.spread.mode
        self._split = first.spread.split
        self._folds = folds
        self._vector = torch.stack([fold._vector for fold in folds])
        self._next: dict[int, int | None] = {}  # first column of a chunk -> its next block

    def fold(
        self,
        layer: int,
        columns: slice,
        spread: Callable[[Tensor], Tensor],
        rowsum: Tensor | None,
    ) -> None:
        if layer not in self.layers:
            return
        start = columns.start or 0
        expected = self.expects(columns)
        if layer != expected:
            raise RuntimeError(f"block {layer} arrived before block {expected} was folded")
        spread_rows, kept = self._split(self._vector[columns], rowsum)
        self._vector[columns] = kept + spread(spread_rows).to(kept.dtype)
        self._next[start] = layer - 1 if layer > self.layers[0] else None

    def rows(self, columns: slice) -> Tensor:
        """The (c, B, N) row vectors of `columns` as folded so far."""
        return self._vector[columns]

    def expects(self, columns: slice) -> int | None:
        """The block that `columns` fold next (None: every block is folded)."""
        return self._next.get(columns.start or 0, self.layers[-1])

    def finish(self) -> None:
        if any(nxt is not None for nxt in self._next.values()) or not self._next:
            raise RuntimeError("a block never arrived; cannot finish the folds")
        for fold, vector in zip(self._folds, self._vector.unbind(), strict=True):
            fold._vector, fold._next = vector, None


LastBlockMap = Callable[[tuple[Tensor, ...], Tensor, Tensor | None], Tensor]
"""A last-block method for C columns at once: (the columns' own rows, each (C, B, N), such
as their readout rows; the block's attention or relevance (B, H, N, N); the columns'
gradients of it (C, B, H, N, N), or None without a backward) -> the maps (C, B, N)."""


def _last_block_map(
    compute: LastBlockMap, rows: tuple[Tensor, ...], attention: Tensor, gradients: Tensor | None
) -> Tensor:
    """`compute` in the rules' dtype (`compute_dtype`)."""
    dtype = compute_dtype(attention)
    gradients = gradients.to(dtype) if gradients is not None else None
    return compute(rows, attention.to(dtype), gradients)


class LastBlock:
    """A method that reads only the last block. Its map `compute` (a `LastBlockMap`) is
    written for C columns at once, so that `ColumnLastBlocks` computes every column of a
    call (classes, generated tokens) in one go; `rows` are this column's own (B, N)
    tensors that the map reads (its readout row, the keys it averages over)."""

    def __init__(self, num_layers: int, compute: LastBlockMap, *rows: Tensor):
        self.layers = range(num_layers - 1, num_layers)
        self.compute = compute
        self.rows = rows
        self._result: Tensor | None = None

    def add(self, layer: int, attention: Tensor, gradient: Tensor | None) -> None:
        if layer in self.layers:
            rows = tuple(row[None] for row in self.rows)
            gradients = gradient[None] if gradient is not None else None
            self._result = _last_block_map(self.compute, rows, attention, gradients)[0]

    def result(self) -> Tensor:
        if self._result is None:
            raise RuntimeError("the last block never arrived")
        return self._result


class ColumnLastBlocks:
    """The last-block maps of C columns (one `LastBlock` each, the same method) computed
    together: each column's rows stacked into (C, B, N), one map over the block for all
    of them, whatever C is.

    `add(layer, columns, attention, gradients)` maps the block for the columns `columns`
    (a chunk of the batched backward, or all of them) with their gradients (c, B, H, N, N);
    `finish()` hands every column's map back to its `LastBlock`, whose `result()` reads it.
    """

    def __init__(self, blocks: Sequence[LastBlock]) -> None:
        first = blocks[0]
        if any(b.compute is not first.compute or b.layers != first.layers for b in blocks):
            raise ValueError("ColumnLastBlocks needs last blocks of one method")
        self.layers = first.layers
        self._blocks = blocks
        columns_rows = zip(*(block.rows for block in blocks), strict=True)
        self._rows = tuple(torch.stack(rows) for rows in columns_rows)
        self._maps: dict[int, Tensor] = {}  # first column of a chunk -> the chunk's maps

    def add(self, layer: int, columns: slice, attention: Tensor, gradients: Tensor | None) -> None:
        if layer not in self.layers:
            return
        rows = tuple(row[columns] for row in self._rows)
        maps = _last_block_map(self._blocks[0].compute, rows, attention, gradients)
        self._maps[columns.start or 0] = maps

    def finish(self) -> None:
        chunks = [self._maps[start] for start in sorted(self._maps)]
        if sum(len(chunk) for chunk in chunks) != len(self._blocks):
            raise RuntimeError("the last block never arrived for every column")
        maps = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
        for block, column_map in zip(self._blocks, maps.unbind(), strict=True):
            block._result = column_map


def last_block(context: RuleContext, compute: LastBlockMap, *rows: Tensor) -> LastBlock:
    """The sink of a last-block method for `context`'s layout, `rows` (B, N) over the last
    block's tokens: read in the last block's one window where the blocks attend within
    windows (`TokenLayout.windows`, `WindowedLastBlock`), else over every token."""
    if context.layout.windows:
        return WindowedLastBlock(context.num_layers, compute, *rows, windows=context.layout.windows)
    return LastBlock(context.num_layers, compute, *rows)


# -- windowed attention (Swin) ------------------------------------------------------------


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


def unmerge_to(vector: Tensor, grid: tuple[int, int], target: tuple[int, int]) -> Tensor:
    """(B, N) over `grid` -> (B, N') over the larger `target` grid of an earlier stage:
    every patch merging between them undone (`unmerge`), the last one first."""
    while grid != target:
        grid = (2 * grid[0], 2 * grid[1])
        vector = unmerge(vector, grid)
    return vector


class WindowedFold(ReadoutFold):
    """`readout @ M_last ... M_first` for a windowed model (Swin, `TokenLayout.windows`),
    `readout` (B, N_last) over the last block's grid; the result (B, N_0) is over the
    input patch grid.

    A windowed block's (N, N) matrix is block-diagonal once its tokens are put in window
    order (the grid rolled by the block's cyclic shift, then cut into windows): with `P`
    that permutation, `M = P^T diag(M_w) P`, so a fold step is the method's step applied
    window by window to the row vector in window order (`to_windows`), then put back
    (`from_windows`): O(N w) per block for windows of w tokens, no (N, N) matrix. A
    patch merging between stages carries relevance as the transpose of the 2 x 2 mean
    (`unmerge`). docs/methods.md derives the rule.

    Each block's records arrive as per-window tensors (B * windows, H, w, w);
    `block_matrix` reduces them to (B * windows, w, w) as for any other model (the rules
    are elementwise over tokens), and `step` is the method's usual fold step, applied in
    window order. Blocks arrive and are folded as in `ReadoutFold` (whose ordering this
    reuses), and the patch mergings between are undone on the way down.
    """

    def __init__(
        self,
        readout: Tensor,
        windows: tuple[WindowedBlock, ...],
        layers: range,
        block_matrix: BlockMatrix,
        step: Step,
    ) -> None:
        super().__init__(readout, layers, block_matrix, step)
        self._blocks = windows
        self._grid = self._blocks[-1].grid

    def _fold(self, layer: int, matrix: Tensor) -> None:
        block = self._blocks[layer]
        self._descend(block.grid)
        folded = self._step(to_windows(self._vector.to(matrix.dtype), block), matrix)
        self._vector = from_windows(folded, block)

    def _descend(self, grid: tuple[int, int]) -> None:
        """Undo the patch mergings between the vector's grid and the larger `grid`."""
        self._vector = unmerge_to(self._vector, self._grid, grid)
        self._grid = grid

    def result(self) -> Tensor:
        super().result()  # raises unless every block has been folded
        self._descend(self._blocks[0].grid)
        return self._vector


class WindowedLastBlock(LastBlock):
    """A last-block method on a windowed model (Swin, `TokenLayout.windows`) whose last
    block attends in one window over its whole grid, as Swin's last stage does at the size
    it was built for (7 x 7 tokens in one 7 x 7 window at 224 pixels): that block's
    recorded attention, (B * 1, H, w, w), is then the attention over all of its tokens,
    in the window's order. The rows (B, N_last), over the last block's grid as the
    readout row is, are put in that order (`to_windows`: the cyclic shift, which a window
    as large as its grid does not have, would be undone too), the method's map is
    computed as for any other model, put back on the grid (`from_windows`) and carried
    through the patch mergings down to the input patch grid (`unmerge_to`, as
    `WindowedFold` does).

    A last block cut into several windows has no attention between them: its tokens are
    never read together, and the model is refused before any forward."""

    def __init__(
        self,
        num_layers: int,
        compute: LastBlockMap,
        *rows: Tensor,
        windows: tuple[WindowedBlock, ...],
    ) -> None:
        last = windows[-1]
        if last.num_windows > 1:
            (height, width), (wr, wc) = last.grid, last.window
            raise UnsupportedModelError(
                "this method reads the last block's attention over all of its tokens at "
                f"once, but this model's last stage attends within {last.num_windows} "
                f"windows of {wr}x{wc} tokens on its {height}x{width} grid, which never "
                "attend to each other; use generic, rollout or raw_attention, which fold "
                "windowed attention, or a model whose last stage is one window (Swin at "
                "the image size it was built for)"
            )
        super().__init__(num_layers, compute, *(to_windows(row, last) for row in rows))
        self._windows = windows

    def result(self) -> Tensor:
        last, first = self._windows[-1], self._windows[0]
        return unmerge_to(from_windows(super().result(), last), last.grid, first.grid)
