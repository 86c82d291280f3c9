"""The folds the methods share, each over every score column of a call at once: the
readout fold (window by window for a windowed model) and the last-block map.

A method is declared once, as one of these over its block matrix; the engine hands the
blocks over per path (whole maps, or, for a spread, the product `u @ Abar` streamed
without maps). docs/architecture.md ("Folds") says how, docs/methods.md derives the
windowed rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

import torch
from torch import Tensor

from explain.errors import UnsupportedModelError
from explain.layout import WindowedBlock
from explain.rules.registry import RowSum, RuleContext, SpreadMode

__all__ = [
    "BlockMatrix",
    "LastBlock",
    "LastBlockMap",
    "ReadoutFold",
    "RowSum",
    "Split",
    "WindowedFold",
    "WindowedLastBlock",
    "attention_spread",
    "chunk_rows",
    "compute_dtype",
    "from_windows",
    "joined",
    "last_block",
    "readout_fold",
    "spread_maps",
    "to_windows",
    "unmerge",
    "unmerge_to",
    "vecmat",
    "weighted_spread",
]

BlockMatrix = Callable[[Tensor, Tensor | None], Tensor]
"""A block's matrix Abar from its records: (attention (B, H, N, N), the columns'
gradients (c, B, H, N, N) or None) -> (B, N, N), or (c, B, N, N) where it depends on the
gradients."""

Split = Callable[[Tensor, RowSum], tuple[Tensor, Tensor | None]]
"""One factor of a readout fold: (the rows v (c, B, N), Abar's row sums) -> (u, kept),
so that the rows become `kept + u @ Abar` (`u @ Abar` where nothing is kept: None)."""


def compute_dtype(tensor: Tensor) -> torch.dtype:
    """Rules run in the model's dtype, but at least float32 (half precision loses mass)."""
    return tensor.dtype if tensor.dtype in (torch.float32, torch.float64) else torch.float32


def vecmat(rows: Tensor, matrix: Tensor) -> Tensor:
    """Rows times matrices: (c, B, N) x (B, N, M), one matrix for every column, or
    (c, B, N, M), one per column -> (c, B, M)."""
    if matrix.dim() == rows.dim():
        return torch.bmm(rows.transpose(0, 1), matrix).transpose(0, 1)
    columns, batch, count = rows.shape
    flat = torch.bmm(rows.reshape(columns * batch, 1, count), matrix.flatten(0, 1))
    return flat.view(columns, batch, -1)


def weighted_spread(rows: Tensor, weights: Tensor) -> Tensor:
    """sum over heads h and query rows i of rows[c, b, i] * weights[c, b, h, i, :]: (C, B,
    K) from (C, B, r) and (C, B, H, r, K). The head mean's division is the caller's."""
    columns, batch, count = rows.shape
    heads, width = weights.shape[2], weights.shape[-1]
    flat = rows[:, :, None, :].expand(columns, batch, heads, count)
    flat = flat.reshape(columns * batch, 1, heads * count)
    out = torch.bmm(flat, weights.reshape(columns * batch, heads * count, width))
    return out.view(columns, batch, width)


def attention_spread(rows: Tensor, attention: Tensor) -> Tensor:
    """The same with one map for every column: (C, B, r) and (B, H, r, K) -> (C, B, K)."""
    columns, batch, count = rows.shape
    heads, width = attention.shape[1], attention.shape[-1]
    flat = rows.transpose(0, 1)[:, :, None, :].expand(batch, columns, heads, count)
    flat = flat.reshape(batch, columns, heads * count)
    out = torch.bmm(flat, attention.reshape(batch, heads * count, width))  # (B, C, K)
    return out.transpose(0, 1)


def spread_maps(rows: Tensor, attention: Tensor, attention_grad: Tensor | None) -> Tensor:
    """`rows @ Abar` from whole maps, without Abar: rows (C, B, N), A (B, H, N, Nk) and dA
    (C, B, H, N, Nk) for Abar = mean_h (dA * A)+, or dA None for mean_h A -> (C, B, Nk),
    in float32 (float64 for float64 rows)."""
    dtype = torch.float64 if rows.dtype == torch.float64 else torch.float32
    rows, attention = rows.to(dtype), attention.to(dtype)
    if attention_grad is None:
        spread = attention_spread(rows, attention)
    else:  # not in place: dA may be autograd's own gradient
        spread = weighted_spread(rows, (attention_grad.to(dtype) * attention).clamp_(min=0))
    return spread.div_(attention.shape[1])


def chunk_rows(rows: Tensor, columns: slice) -> Tensor:
    """The (c, B, ...) rows of the columns `columns` from (R, B, ...) `rows`: one per
    column (R = C), or one that every column shares (R = 1), repeated for each (once for
    slice(None), a forward's blocks that serve every column)."""
    if len(rows) > 1:
        return rows[columns]
    width = 1 if columns.stop is None else columns.stop - (columns.start or 0)
    return rows if width == 1 else rows.expand(width, *rows.shape[1:])


def joined(chunks: Mapping[int, Tensor]) -> Tensor:
    """Per-chunk results (the first column of a chunk -> its (c, B, ...)) as one (C, B,
    ...) in column order."""
    if not chunks:
        raise RuntimeError("no block arrived; cannot finish the fold")
    if len(chunks) == 1:
        return next(iter(chunks.values()))
    return torch.cat([chunks[start] for start in sorted(chunks)])


class ReadoutFold:
    """`readout @ M_last ... M_first` over blocks `layers`, for every column of a call.

    Only the readout rows of the aggregated matrix are ever needed, so they are folded
    right to left, O(L N^2) per sample instead of O(L N^3): a block enters only through
    its matrix Abar = `matrix(attention, gradients)`, the rows v becoming `kept + u @
    Abar` with `(u, kept) = split(v, rowsum)`. Where Abar is a standard head mean
    (`spread`, a `SpreadMode`), whole maps are applied without it (`spread_maps`) and
    the engine may hand the block over as the product itself (`fold`), which it streams
    from q, k, v and dO on the fused path.

    `readout` is (R, B, N) (`chunk_rows`). Blocks arrive per chunk of columns, in any
    order: a block is folded as soon as every later block has been (in the backward pass,
    last block first, on arrival); an earlier one is kept until then as what its product
    needs (its matrix, or a head mean).
    """

    def __init__(
        self,
        readout: Tensor,
        layers: range,
        matrix: BlockMatrix,
        split: Split,
        *,
        spread: SpreadMode | None = None,
    ) -> None:
        self.layers = layers
        self.spread = spread
        self._readout = readout.to(compute_dtype(readout))
        self._matrix = matrix
        self._split = split
        self._rows: dict[int, Tensor] = {}  # first column of a chunk -> its rows so far
        self._next: dict[int, int | None] = {}  # ... -> the block it folds next
        self._waiting: dict[int, dict[int, tuple[Callable[[Tensor], Tensor], RowSum]]] = {}

    def add(self, layer: int, columns: slice, attention: Tensor, gradients: Tensor | None) -> None:
        """Block `layer` for `columns` from its whole maps."""
        if layer not in self.layers:
            return
        if self.spread is SpreadMode.GRADIENT:
            product = partial(spread_maps, attention=attention, attention_grad=gradients)
            self.fold(layer, columns, product, _every_row_one)
            return
        if self.spread is SpreadMode.ATTENTION:  # all that mean_h A needs: kept small if it waits
            mean = attention.mean(dim=1, keepdim=True)
            dtype = torch.float64 if mean.dtype == torch.float64 else torch.float32
            product = partial(spread_maps, attention=mean, attention_grad=None)
            self.fold(layer, columns, product, lambda: mean.sum(dim=-1, dtype=dtype)[:, 0])
            return
        dtype = compute_dtype(attention)
        gradients = gradients.to(dtype) if gradients is not None else None
        matrix = self._matrix(attention.to(dtype), gradients)
        self.fold(
            layer, columns, lambda rows: vecmat(rows.to(dtype), matrix), lambda: matrix.sum(-1)
        )

    def fold(
        self,
        layer: int,
        columns: slice,
        spread: Callable[[Tensor], Tensor],
        rowsum: RowSum,
    ) -> None:
        """Block `layer` for `columns` as its product: `spread(u)` = u @ Abar for rows u
        (c, B, N), and Abar's row sums."""
        if layer not in self.layers:
            return
        start = columns.start or 0
        waiting = self._waiting.setdefault(start, {})
        waiting[layer] = (spread, rowsum)
        following = self.expects(columns)
        while following is not None and following in waiting:
            rows = self._rows.get(start)
            rows = chunk_rows(self._readout, columns) if rows is None else rows
            self._rows[start] = self._step(following, rows, *waiting.pop(following))
            following = following - 1 if following > self.layers[0] else None
        self._next[start] = following

    def _step(
        self, layer: int, rows: Tensor, spread: Callable[[Tensor], Tensor], rowsum: RowSum
    ) -> Tensor:
        """The rows after block `layer`'s factor (every later block folded)."""
        product, kept = self._split(rows, rowsum)
        spread_rows = spread(product)
        return spread_rows if kept is None else kept + spread_rows.to(kept.dtype)

    def expects(self, columns: slice) -> int | None:
        """The block that `columns` fold next (None: every block is folded)."""
        return self._next.get(columns.start or 0, self.layers[-1])

    def rows(self, columns: slice) -> Tensor:
        """The (c, B, N) rows of `columns` as folded so far."""
        return self._rows[columns.start or 0]

    def result(self) -> Tensor:
        """(C, B, N): every column's rows, once all its blocks are folded."""
        late = [following for following in self._next.values() if following is not None]
        if late:
            raise RuntimeError(f"block {late[0]} never arrived; cannot finish the fold")
        return joined(self._rows)


def _every_row_one() -> None:
    """The row sums of a matrix whose rows all sum to 1 (`RowSum`)."""
    return None


def readout_fold(
    context: RuleContext,
    layers: range,
    matrix: BlockMatrix,
    split: Split,
    *,
    spread: SpreadMode | None = None,
) -> ReadoutFold:
    """The readout fold of `context`'s layout over `layers`: window by window where its
    blocks attend within windows (`TokenLayout.windows`, `WindowedFold`, which has no
    spread), else over every token."""
    if context.layout.windows:
        return WindowedFold(context.readout, context.layout.windows, layers, matrix, split)
    return ReadoutFold(context.readout, layers, matrix, split, spread=spread)


LastBlockMap = Callable[[tuple[Tensor, ...], Tensor, Tensor | None], Tensor]
"""A last-block method for c columns at once: (the columns' own rows, each (c, B, N),
such as their readout rows; the block's attention or relevance (B, H, N, N); the
columns' gradients of it (c, B, H, N, N), or None without a backward) -> the maps (c, B,
N)."""


class LastBlock:
    """A method that reads only the last block: its map `compute` (a `LastBlockMap`) for
    every chunk of columns at once; `rows` are the (R, B, N) tensors it reads
    (`chunk_rows`: the readout rows, the keys it averages over)."""

    spread: SpreadMode | None = None

    def __init__(self, num_layers: int, compute: LastBlockMap, *rows: Tensor) -> None:
        self.layers = range(num_layers - 1, num_layers)
        self._compute = compute
        self._rows = rows
        self._maps: dict[int, Tensor] = {}  # first column of a chunk -> its maps

    def add(self, layer: int, columns: slice, attention: Tensor, gradients: Tensor | None) -> None:
        if layer not in self.layers:
            return
        dtype = compute_dtype(attention)
        gradients = gradients.to(dtype) if gradients is not None else None
        rows = tuple(chunk_rows(row, columns) for row in self._rows)
        self._maps[columns.start or 0] = self._compute(rows, attention.to(dtype), gradients)

    def result(self) -> Tensor:
        return joined(self._maps)


def last_block(context: RuleContext, compute: LastBlockMap, *rows: Tensor) -> LastBlock:
    """The fold of a last-block method for `context`'s layout, `rows` (R, B, N) over the
    last block's tokens: read in the last block's one window where the blocks attend within
    windows (`TokenLayout.windows`, `WindowedLastBlock`), else over every token."""
    if context.layout.windows:
        return WindowedLastBlock(context.num_layers, compute, *rows, windows=context.layout.windows)
    return LastBlock(context.num_layers, compute, *rows)


# -- windowed attention (Swin) ------------------------------------------------------------


def to_windows(vector: Tensor, block: WindowedBlock) -> Tensor:
    """(..., B, N) over `block`'s grid -> (..., B * windows, w) in the order the block's
    attention sees its tokens: the grid rolled by -shift, then cut into windows
    (batch-major, then windows row-major, then tokens row-major inside a window)."""
    lead = vector.shape[:-1]
    (rows, columns), (wr, wc) = block.grid, block.window
    grid = vector.reshape(-1, rows, columns)
    if any(block.shift):
        grid = torch.roll(grid, shifts=(-block.shift[0], -block.shift[1]), dims=(1, 2))
    windows = grid.reshape(-1, rows // wr, wr, columns // wc, wc).permute(0, 1, 3, 2, 4)
    return windows.reshape(*lead[:-1], lead[-1] * block.num_windows, block.window_tokens)


def from_windows(windows: Tensor, block: WindowedBlock) -> Tensor:
    """The inverse of `to_windows`: (..., B * windows, w) -> (..., B, N) over `block`'s
    grid."""
    lead = windows.shape[:-1]
    (rows, columns), (wr, wc) = block.grid, block.window
    grid = windows.reshape(-1, rows // wr, columns // wc, wr, wc).permute(0, 1, 3, 2, 4)
    grid = grid.reshape(-1, rows, columns)
    if any(block.shift):
        grid = torch.roll(grid, shifts=block.shift, dims=(1, 2))
    return grid.reshape(*lead[:-1], lead[-1] // block.num_windows, rows * columns)


def unmerge(vector: Tensor, grid: tuple[int, int]) -> Tensor:
    """(..., N / 4) over the merged grid -> (..., N) over the (rows, columns) `grid` before
    the merge: each merged token's value split equally over its 2 x 2 tokens (the
    transpose of the 2 x 2 mean, which keeps the row's total)."""
    lead = vector.shape[:-1]
    merged = vector.reshape(-1, grid[0] // 2, grid[1] // 2)
    spread = merged.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2) / 4
    return spread.reshape(*lead, grid[0] * grid[1])


def unmerge_to(vector: Tensor, grid: tuple[int, int], target: tuple[int, int]) -> Tensor:
    """(..., N) over `grid` -> (..., N') over the larger `target` grid of an earlier stage:
    every patch merging between them undone (`unmerge`), the last one first."""
    while grid != target:
        grid = (2 * grid[0], 2 * grid[1])
        vector = unmerge(vector, grid)
    return vector


class WindowedFold(ReadoutFold):
    """`readout @ M_last ... M_first` for a windowed model (Swin, `TokenLayout.windows`),
    `readout` (R, B, N_last) over the last block's grid; the result (C, B, N_0) is over
    the input patch grid.

    A windowed block's matrix is block-diagonal once its tokens are put in window order
    (`to_windows`), so each factor is the method's own, applied window by window to the
    rows in that order and put back (`from_windows`): O(N w) per block, no (N, N) matrix.
    Its records arrive per window (B * windows, H, w, w), which `matrix` reduces as for
    any model; a patch merging between stages carries the rows back as the transpose of
    the 2 x 2 mean (`unmerge`). docs/methods.md derives the rule.
    """

    def __init__(
        self,
        readout: Tensor,
        windows: tuple[WindowedBlock, ...],
        layers: range,
        matrix: BlockMatrix,
        split: Split,
    ) -> None:
        super().__init__(readout, layers, matrix, split)
        self._blocks = windows
        self._grids = {block.num_tokens: block.grid for block in windows}

    def _step(
        self, layer: int, rows: Tensor, spread: Callable[[Tensor], Tensor], rowsum: RowSum
    ) -> Tensor:
        block = self._blocks[layer]
        rows = self._descend(rows, block.grid)
        folded = super()._step(layer, to_windows(rows, block), spread, rowsum)
        return from_windows(folded, block)

    def _descend(self, rows: Tensor, grid: tuple[int, int]) -> Tensor:
        """`rows` (c, B, n) carried through the patch mergings between their grid and the
        larger `grid`."""
        return unmerge_to(rows, self._grids[rows.shape[-1]], grid)

    def result(self) -> Tensor:
        return self._descend(super().result(), self._blocks[0].grid)


class WindowedLastBlock(LastBlock):
    """A last-block method on a windowed model (Swin, `TokenLayout.windows`) whose last
    block attends in one window over its whole grid, as Swin's last stage does at the size
    it was built for (7 x 7 tokens in one 7 x 7 window at 224 pixels): that block's
    recorded attention, (B * 1, H, w, w), is then the attention over all of its tokens,
    in the window's order. The rows (R, B, N_last), over the last block's grid as the
    readout rows are, are put in that order (`to_windows`: the cyclic shift, which a window
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
