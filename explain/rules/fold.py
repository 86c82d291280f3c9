"""Sinks shared by the rules: folding the readout row, and last-block methods.

Only the readout row of an aggregated matrix M = M_{L-1} ... M_s is ever needed, so it is
folded right to left as vector-matrix products, `v <- step(v, M_l)` for l = L-1 down to
s: O(L N^2) per sample instead of O(L N^3). Block matrices may arrive in any order; each
one is folded as soon as every later block has been, so in the backward pass (last block
first) every block is folded and freed on arrival.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["LastBlock", "ReadoutFold", "compute_dtype", "vecmat"]

BlockMatrix = Callable[[Tensor, Tensor | None], Tensor]
Step = Callable[[Tensor, Tensor], Tensor]


def compute_dtype(tensor: Tensor) -> torch.dtype:
    """Rules run in the model's dtype, but at least float32 (half precision loses mass)."""
    return tensor.dtype if tensor.dtype in (torch.float32, torch.float64) else torch.float32


def vecmat(vector: Tensor, matrix: Tensor) -> Tensor:
    """Per-sample row vector times matrix: (B, N) x (B, N, M) -> (B, M)."""
    return torch.bmm(vector.unsqueeze(1), matrix).squeeze(1)


class ReadoutFold:
    """Fold `readout @ M_{last} ... M_{first}` over blocks `layers`.

    `block_matrix(attention, gradient)` reduces one block's records to its (B, N, N)
    matrix; `step(v, matrix)` applies one factor to the row vector.
    """

    def __init__(self, readout: Tensor, layers: range, block_matrix: BlockMatrix, step: Step):
        self.layers = layers
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
            matrix = self._pending.pop(self._next)
            self._vector = self._step(self._vector.to(matrix.dtype), matrix)
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
