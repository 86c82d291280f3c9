"""Sinks shared by the rules: folding the readout row, and last-block methods.

Only the readout row of an aggregated matrix M = M_{L-1} ... M_s is ever needed, so it is
folded right to left as vector-matrix products, `v <- step(v, M_l)` for l = L-1 down to
s: O(L N^2) per sample instead of O(L N^3). Block matrices may arrive in any order; each
one is folded as soon as every later block has been, so in the backward pass (last block
first) every block is folded and freed on arrival.

Every step is a sum over the rows of M_l (`Step`), so a block can also arrive as chunks
of query rows (`ReadoutFold.add_rows`, explain.fused's streaming): the fold then never
holds more than one chunk of the block's N x N matrix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["AttentionRows", "LastBlock", "ReadoutFold", "Step", "compute_dtype", "vecmat"]

BlockMatrix = Callable[[Tensor, Tensor | None], Tensor]
Step = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
"""One factor of the fold, by rows: (v_rows (B, c), M_rows (B, c, N)) -> (what the rows
spread over all tokens (B, N), what they keep on their own tokens (B, c)). The new row
vector is the sum of every chunk's spread plus, at each chunk's rows, what it keeps."""


@dataclass(frozen=True)
class AttentionRows:
    """Query rows `rows` of one block's attention (B, H, c, K) and its gradient, over the
    first K <= N keys (the later keys are masked for these rows: causal attention)."""

    rows: slice
    attention: Tensor
    gradient: Tensor | None


def compute_dtype(tensor: Tensor) -> torch.dtype:
    """Rules run in the model's dtype, but at least float32 (half precision loses mass)."""
    return tensor.dtype if tensor.dtype in (torch.float32, torch.float64) else torch.float32


def vecmat(vector: Tensor, matrix: Tensor) -> Tensor:
    """Per-sample row vector times matrix: (B, N) x (B, N, M) -> (B, M)."""
    return torch.bmm(vector.unsqueeze(1), matrix).squeeze(1)


class ReadoutFold:
    """Fold `readout @ M_{last} ... M_{first}` over blocks `layers`.

    `block_matrix(attention, gradient)` reduces one block's records to its (B, N, N)
    matrix (or a chunk of its rows to those rows); `step` applies one factor to the row
    vector (see `Step`).
    """

    takes_rows = True  # a RowSink: add_rows folds a block by chunks of query rows

    def __init__(
        self,
        readout: Tensor,
        layers: range,
        block_matrix: BlockMatrix,
        step: Step,
        *,
        streamable: bool = False,
    ):
        self.layers = layers
        self.streamable = streamable
        """Whether `block_matrix` works row by row (a chunk of rows -> those rows); off
        unless the method says so, since a matrix normalised as a whole would silently
        fold wrong by rows."""
        self._block_matrix = block_matrix
        self._step = step
        self._vector = readout.to(compute_dtype(readout))
        self._next = layers[-1] if len(layers) else None
        self._pending: dict[int, Tensor] = {}

    def _matrix(self, attention: Tensor, gradient: Tensor | None) -> Tensor:
        dtype = compute_dtype(attention)
        gradient = gradient.to(dtype) if gradient is not None else None
        return self._block_matrix(attention.to(dtype), gradient)

    def add(self, layer: int, attention: Tensor, gradient: Tensor | None) -> None:
        if layer not in self.layers:
            return
        self._pending[layer] = self._matrix(attention, gradient)
        self._fold_pending()

    def add_rows(self, layer: int, chunks: Iterable[AttentionRows]) -> None:
        """A block by chunks of query rows. Folded chunk by chunk when every later block
        has been folded (the backward's order); otherwise, or when the block matrix is
        not row-wise (`streamable` False), the chunks are joined and kept as by `add`."""
        if layer not in self.layers:
            return
        tokens = self._vector.shape[-1]
        if layer != self._next or not self.streamable:
            matrices = [self._matrix(c.attention, c.gradient) for c in chunks]
            widths = [tokens - m.shape[-1] for m in matrices]  # masked keys: zeros
            padded = [F.pad(m, (0, w)) if w else m for m, w in zip(matrices, widths, strict=True)]
            self._pending[layer] = torch.cat(padded, dim=1)
            self._fold_pending()
            return
        vector = self._vector
        folded: Tensor | None = None
        for chunk in chunks:
            matrix = self._matrix(chunk.attention, chunk.gradient)
            vector = vector.to(matrix.dtype)
            if folded is None:
                folded = torch.zeros_like(vector)
            spread, kept = self._step(vector[:, chunk.rows], matrix)
            folded[:, : spread.shape[-1]] += spread
            folded[:, chunk.rows] += kept
        assert folded is not None, "a block arrived without rows"
        self._vector = folded
        self._advance()
        self._fold_pending()

    def _fold_pending(self) -> None:
        while self._next is not None and self._next in self._pending:
            matrix = self._pending.pop(self._next)
            spread, kept = self._step(self._vector.to(matrix.dtype), matrix)
            self._vector = spread + kept
            self._advance()

    def _advance(self) -> None:
        assert self._next is not None
        self._next = self._next - 1 if self._next > self.layers[0] else None

    def result(self) -> Tensor:
        if self._next is not None:
            raise RuntimeError(f"block {self._next} never arrived; cannot finish the fold")
        return self._vector


class LastBlock:
    """A method that reads only the last block: `compute(attention, gradient)` -> (B, N)."""

    def __init__(self, num_layers: int, compute: Callable[[Tensor, Tensor | None], Tensor]):
        self.layers = range(num_layers - 1, num_layers)
        self._compute = compute
        self._result: Tensor | None = None

    def add(self, layer: int, attention: Tensor, gradient: Tensor | None) -> None:
        if layer in self.layers:
            dtype = compute_dtype(attention)
            gradient = gradient.to(dtype) if gradient is not None else None
            self._result = self._compute(attention.to(dtype), gradient)

    def result(self) -> Tensor:
        if self._result is None:
            raise RuntimeError("the last block never arrived")
        return self._result
