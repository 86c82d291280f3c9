"""The sinks of every score column at once, block by block.

A call explains C columns (classes of one input, the generated tokens of a generation),
and each column's sink folds its own readout row. Where every column's sink is a readout
fold whose step is a spread of the block (generic, rollout with head means, raw
attention: see explain.rules.fold.Spread), `SpreadFold` stacks them into one (C, B, N)
fold per token set and folds each block once for all columns: from the recorded maps on
the explicit path (`spread_maps`), from q, k, v and dO on the fused path
(`readout_spread`, without any N x N map). Where every column's sink reads the last block
only (attention GradCAM: explain.rules.fold.LastBlock), `LastBlockFold` maps that block
once for all columns. Where every column's sink is a two-set fold (an encoder-decoder's
positions, a detector's detections: explain.rules.coattention), `TwoSetColumnFold` runs
the folds of all columns as one. The number of operations per block then depends neither
on the batch nor on the columns nor on the heads. Every other sink takes whole maps,
column by column.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, TypeVar

import torch
from torch import Tensor

from explain.engine.kernels import live_rows, readout_spread, spread_maps
from explain.fused import FusedBlock, attention_gradient
from explain.rules import Sink
from explain.rules.coattention import ColumnTwoSetFolds, TwoSetFold
from explain.rules.fold import (
    ColumnFolds,
    ColumnLastBlocks,
    LastBlock,
    ReadoutFold,
    compute_dtype,
)

__all__ = ["LastBlockFold", "PerSetSinks", "SpreadFold", "TwoSetColumnFold"]

Stack = TypeVar("Stack", ColumnFolds, ColumnLastBlocks)


class PerSetSinks(Protocol):
    """A column's sinks as explain.engine.passes.ColumnSink offers them: (the set's
    model-wide layers, its sink) per token set; empty for a fold over several sets."""

    def parts(self) -> list[tuple[Sequence[int], Sink]]: ...


class SpreadFold:
    """The columns' folds as one (`of` builds it, or says that the sinks cannot be).

    `add(layer, columns, record, gradient)` is a `explain.recorder.BlockCallback`;
    `finish()` hands each column's row vector back to its sink for `result()`.
    `max_bytes` bounds the temporaries of a fused block's spread.
    """

    def __init__(self, folds: list[tuple[Sequence[int], ColumnFolds]], max_bytes: int) -> None:
        self._folds = [stack for _, stack in folds]
        self._route = _routes(folds)
        self._max_bytes = max_bytes
        self._masks: dict[int, tuple[Tensor, Tensor | None, bool]] = {}
        self._kept: dict[int, Tensor] = {}

    @classmethod
    def of(cls, sinks: Sequence[PerSetSinks], max_bytes: int) -> SpreadFold | None:
        """The fold of `sinks` (one per column), or None unless every column's sink is a
        readout fold per token set with a spread, alike across columns."""

        def stack(column_sinks: list[Sink]) -> ColumnFolds | None:
            if not all(isinstance(s, ReadoutFold) and s.spread for s in column_sinks):
                return None
            return ColumnFolds(column_sinks)  # type: ignore[arg-type]

        folds = _stacked(sinks, stack)
        return None if folds is None else cls(folds, max_bytes)

    def add(
        self, layer: int, columns: slice, record: FusedBlock | Tensor, gradient: Tensor | None
    ) -> None:
        """Fold block `layer` for `columns` from its record (`BlockCallback`)."""
        route = self._route.get(layer)
        if route is None:
            return
        stack, local = route
        grad = gradient if stack.mode == "gradient" else None
        if isinstance(record, Tensor):
            self._add_maps(stack, local, columns, record, grad)
            return
        key_mask, exact = self._key_mask(record)
        query, key, value = record.tensors()
        if not exact:  # the mask is more than keys and causality: fold the whole map
            maps = None if grad is None else attention_gradient(grad, value[None])
            self._add_maps(stack, local, columns, record.probabilities(), maps)
            return
        live = live_rows(key_mask, record.site.causal)
        stack.fold(
            local,
            columns,
            lambda rows: readout_spread(
                rows,
                query,
                key,
                value,
                grad,
                scale=record.site.scale,
                causal=record.site.causal,
                key_mask=key_mask,
                mode=stack.mode,
                max_bytes=self._max_bytes,
            ),
            None if live is None or stack.mode == "gradient" else live.expand(query.shape[0], -1),
        )

    def keep(self, layer: int, attention: Tensor) -> None:
        """A forward-only method's block from the explicit forward, which hands the blocks
        first to last: its head mean is kept until `fold_kept`, after the forward."""
        if layer in self._route:
            self._kept[layer] = attention.mean(dim=1, keepdim=True)

    def fold_kept(self) -> None:
        """Fold the kept blocks, last first (`keep`)."""
        for layer in sorted(self._kept, reverse=True):
            self.add(layer, slice(None), self._kept.pop(layer), None)

    def _add_maps(
        self,
        stack: ColumnFolds,
        local: int,
        columns: slice,
        attention: Tensor,
        attention_grad: Tensor | None,
    ) -> None:
        rowsum = None
        if stack.mode == "attention":  # Abar's row sums, for rollout's normalisation
            dtype = torch.float64 if attention.dtype == torch.float64 else torch.float32
            rowsum = attention.sum(dim=-1, dtype=dtype).mean(dim=1)
        stack.fold(
            local, columns, lambda rows: spread_maps(rows, attention, attention_grad), rowsum
        )

    def _key_mask(self, block: FusedBlock) -> tuple[Tensor | None, bool]:
        """The block's key mask and whether it is the whole mask, read once per mask
        tensor (blocks share theirs): the only wait for the device a block can cost."""
        mask = block.mask
        if mask is None:
            return None, True
        cached = self._masks.get(id(mask))
        if cached is None or cached[0] is not mask:
            keys, exact = block.key_mask()
            cached = self._masks[id(mask)] = (mask, keys, exact is None or bool(exact))
        return cached[1], cached[2]

    def finish(self) -> None:
        for stack in self._folds:
            stack.finish()


class LastBlockFold:
    """The last-block maps of every column at once (`of` builds it, or says that the sinks
    cannot be): `add` is a `explain.recorder.BlockCallback`, `finish()` hands each
    column's map back to its sink for `result()`.

    On the explicit path a block's record is its attention, with dA for a chunk of
    columns (c, B, H, N, N), as the sinks take them. On the fused path the last block's A
    is recomputed from q and k once for all columns, and dA = dO v^T for as many columns
    at a time as fit `max_bytes` (the explicit path's chunks of columns hold as much).
    """

    def __init__(
        self, stacks: list[tuple[Sequence[int], ColumnLastBlocks]], max_bytes: int
    ) -> None:
        self._stacks = [stack for _, stack in stacks]
        self._route = _routes(stacks)
        self._max_bytes = max_bytes

    @classmethod
    def of(cls, sinks: Sequence[PerSetSinks], max_bytes: int) -> LastBlockFold | None:
        """The maps of `sinks` (one per column), or None unless every column's sink is a
        last block per token set, of one method across columns."""

        def stack(column_sinks: list[Sink]) -> ColumnLastBlocks | None:
            if not all(isinstance(s, LastBlock) for s in column_sinks):
                return None
            return ColumnLastBlocks(column_sinks)  # type: ignore[arg-type]

        stacks = _stacked(sinks, stack)
        return None if stacks is None else cls(stacks, max_bytes)

    def add(
        self, layer: int, columns: slice, record: FusedBlock | Tensor, gradient: Tensor | None
    ) -> None:
        """Map block `layer` for `columns` from its record (`BlockCallback`)."""
        route = self._route.get(layer)
        if route is None:
            return
        stack, local = route
        for part, attention, maps in _whole_maps(columns, record, gradient, self._max_bytes):
            stack.add(local, part, attention, maps)

    def finish(self) -> None:
        for stack in self._stacks:
            stack.finish()


class TwoSetColumnFold:
    """The two-set folds of every column at once (`of` builds it, or says that the sinks
    cannot be): `add` is a `explain.recorder.BlockCallback` that hands each block's maps
    to `explain.rules.coattention.ColumnTwoSetFolds` (on the fused path A recomputed once,
    dA = dO v^T for as many columns at a time as fit `max_bytes`), `finish()` hands each
    column's matrices and rows back to its fold for `result()` and `read()`.
    """

    def __init__(self, folds: ColumnTwoSetFolds, max_bytes: int) -> None:
        self._folds = folds
        self._max_bytes = max_bytes

    @classmethod
    def of(cls, sinks: Sequence[object], max_bytes: int) -> TwoSetColumnFold | None:
        """The fold of `sinks` (one per column), or None unless every one is a two-set fold
        over the same roles and token sets."""
        if not all(isinstance(sink, TwoSetFold) for sink in sinks):
            return None
        try:
            return cls(ColumnTwoSetFolds(sinks), max_bytes)  # type: ignore[arg-type]
        except ValueError:
            return None

    def add(
        self, layer: int, columns: slice, record: FusedBlock | Tensor, gradient: Tensor | None
    ) -> None:
        """Take block `layer` for `columns` from its record (`BlockCallback`)."""
        if layer not in self._folds.layers:
            return
        for part, attention, maps in _whole_maps(columns, record, gradient, self._max_bytes):
            self._folds.add(layer, part, attention, maps)

    def finish(self) -> None:
        self._folds.finish()


def _whole_maps(
    columns: slice, record: FusedBlock | Tensor, gradient: Tensor | None, max_bytes: int
) -> Iterator[tuple[slice, Tensor, Tensor | None]]:
    """A block's whole maps for a `BlockCallback`'s `columns`: (columns, A (B, H, N, N),
    their dA (c, B, H, N, N) or None). The explicit path's record is A, with dA for all of
    `columns` at once; a fused block's A is recomputed once, and dA = dO v^T for as many
    columns at a time as fit `max_bytes` (the explicit path's chunks of columns hold as
    much)."""
    if isinstance(record, Tensor):
        yield columns, record, gradient
        return
    probabilities = record.probabilities()
    attention = probabilities.to(compute_dtype(probabilities))  # once for every chunk
    if gradient is None:
        yield columns, attention, None
        return
    _, _, value = record.tensors()
    value = value.to(attention.dtype)[None]
    step = max(1, max_bytes // (attention.numel() * attention.element_size()))
    start = columns.start or 0
    for first in range(0, gradient.shape[0], step):  # one step unless dA outgrows the budget
        part = gradient[first : first + step]
        with torch.no_grad():
            maps = attention_gradient(part.to(attention.dtype), value)
        yield slice(start + first, start + first + len(part)), attention, maps


def _stacked(
    sinks: Sequence[PerSetSinks], stack: Callable[[list[Sink]], Stack | None]
) -> list[tuple[Sequence[int], Stack]] | None:
    """(the set's model-wide layers, `stack` of the columns' sinks of that set) per token
    set, or None where a column has no parts or `stack` refuses a set's sinks (returns
    None, or raises ValueError: the methods or blocks differ between columns)."""
    parts = [sink.parts() for sink in sinks]
    if not all(parts):
        return None
    stacks = []
    for index, (layers, _) in enumerate(parts[0]):
        try:
            made = stack([column[index][1] for column in parts])
        except ValueError:
            return None
        if made is None:
            return None
        stacks.append((layers, made))
    return stacks


def _routes(stacks: list[tuple[Sequence[int], Stack]]) -> dict[int, tuple[Stack, int]]:
    """Each model-wide layer a stack takes -> (the stack, the layer within its set)."""
    return {layers[local]: (stack, local) for layers, stack in stacks for local in stack.layers}
