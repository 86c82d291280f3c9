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

A token set may be read out by another set's result (`ReadOut`: a vision-language
model's tower, read out by the language model's relevance at the image tokens): its
folds start, chunk of columns by chunk, from the rows the other set's folds end with,
and then fold as any other set's. A block attended piece by piece (`Pieces`: a packed
tower's windows) is folded as a batch of its pieces, padded to the longest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol, TypeVar

import torch
from torch import Tensor

from explain.engine.fused import FusedBlock, attention_gradient
from explain.engine.kernels import live_rows, readout_spread, spread_maps
from explain.layout import Pieces
from explain.rules import Sink
from explain.rules.coattention import ColumnTwoSetFolds, TwoSetFold
from explain.rules.fold import (
    ColumnFolds,
    ColumnLastBlocks,
    LastBlock,
    ReadoutFold,
    compute_dtype,
)

__all__ = ["LastBlockFold", "PerSetSinks", "ReadOut", "SpreadFold", "TwoSetColumnFold"]

Stack = TypeVar("Stack", "ColumnFolds | _ReadOutFolds", ColumnLastBlocks)


@dataclass(frozen=True)
class ReadOut:
    """A token set's fold whose readout rows are another set's result, as a column's
    `parts()` gives it in place of a sink (the sink is made once those rows are known).

    Attributes:
        after: the index, among the column's parts, of the set whose folded rows read
            this one out (an earlier part, itself a sink).
        layers: the set's blocks that its sink will fold (the sink's `layers`).
        readout: (..., B, N_after) rows of the set `after`, folded to its end -> (..., B',
            N) this set's readout rows; alike for every column, batched over the leading
            dimensions.
        start: this column's sink from its readout row (B', N): a readout fold with the
            same spread as the set `after`'s.
    """

    after: int
    layers: range
    readout: Callable[[Tensor], Tensor]
    start: Callable[[Tensor], Sink]


class PerSetSinks(Protocol):
    """A column's sinks as explain.engine.passes.ColumnSink offers them: (the set's
    model-wide layers, its sink, or a `ReadOut`) per token set; empty for a fold over
    several sets."""

    def parts(self) -> list[tuple[Sequence[int], Sink | ReadOut]]: ...


class SpreadFold:
    """The columns' folds as one (`of` builds it, or says that the sinks cannot be).

    `add(layer, columns, record, gradient)` is a `explain.recorder.BlockCallback`;
    `finish()` hands each column's row vector back to its sink for `result()`.
    `max_bytes` bounds the temporaries of a fused block's spread.
    """

    def __init__(
        self, folds: list[tuple[Sequence[int], ColumnFolds | _ReadOutFolds]], max_bytes: int
    ) -> None:
        self._folds = [stack for _, stack in folds]
        self._route = _routes(folds)
        self._max_bytes = max_bytes
        self._masks: dict[int, tuple[Tensor, Tensor | None, bool]] = {}
        self._pieces: dict[Pieces, tuple[Tensor, Tensor, Tensor]] = {}
        self._kept: dict[int, Tensor] = {}

    @classmethod
    def of(cls, sinks: Sequence[PerSetSinks], max_bytes: int) -> SpreadFold | None:
        """The fold of `sinks` (one per column), or None unless every column's sink is a
        readout fold per token set with a spread (or a `ReadOut` of one), alike across
        columns."""

        def stack(
            column_parts: list[Sink | ReadOut], earlier: list[ColumnFolds | _ReadOutFolds]
        ) -> ColumnFolds | _ReadOutFolds | None:
            first = column_parts[0]
            if isinstance(first, ReadOut):
                read_outs = [p for p in column_parts if isinstance(p, ReadOut)]
                after = earlier[first.after] if 0 <= first.after < len(earlier) else None
                if len(read_outs) != len(column_parts) or not isinstance(after, ColumnFolds):
                    return None
                return _ReadOutFolds(after, read_outs)
            if not all(isinstance(s, ReadoutFold) and s.spread for s in column_parts):
                return None
            return ColumnFolds(column_parts)  # type: ignore[arg-type]

        folds = _stacked(sinks, stack)
        return None if folds is None else cls(folds, max_bytes)

    @torch.no_grad()
    def add(
        self, layer: int, columns: slice, record: FusedBlock | Tensor, gradient: Tensor | None
    ) -> None:
        """Fold block `layer` for `columns` from its record (`BlockCallback`), outside
        autograd: a block's q and k may be part of the model's graph (a probe shows the
        kernel's own), and a fold on them would keep every chunk's temporaries alive."""
        route = self._route.get(layer)
        if route is None:
            return
        stack, local = route
        grad = gradient if stack.mode == "gradient" else None
        if isinstance(record, Tensor):
            self._add_maps(stack, local, columns, record, grad)
            return
        if isinstance(record.mask, Pieces):
            self._add_pieces(stack, local, columns, record, record.mask, grad)
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

    def _add_pieces(
        self,
        stack: ColumnFolds | _ReadOutFolds,
        local: int,
        columns: slice,
        block: FusedBlock,
        pieces: Pieces,
        grad: Tensor | None,
    ) -> None:
        """A block attended piece by piece: the pieces of every sequence stacked as one
        batch of sequences, each padded to the longest piece with keys masked (a padding
        row spreads nothing: its readout entry is 0, its dO 0), folded as any block is,
        and the result put back in token order. Exact, and no (N x N) map is built."""
        query, key, value = block.tensors()
        where, position, keys = self._piece_index(pieces, query.device)
        batch = query.shape[0]
        q, k, v = (_into_pieces(t, where, 0, 2) for t in (query, key, value))
        output_grad = None if grad is None else _into_pieces(grad, where, 1, 3)
        key_mask = keys.expand(batch, -1, -1).flatten(0, 1)

        def spread(rows: Tensor) -> Tensor:
            folded = readout_spread(
                _into_pieces(rows, where, 1, 2),
                q,
                k,
                v,
                output_grad,
                scale=block.site.scale,
                causal=False,
                key_mask=key_mask,
                mode=stack.mode,
                max_bytes=self._max_bytes,
            )
            return folded.unflatten(1, (batch, -1)).flatten(2).index_select(-1, position)

        stack.fold(local, columns, spread, None)  # every piece has keys: rows sum to 1

    def _piece_index(self, pieces: Pieces, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """For `pieces` of N tokens, P pieces of at most w: (P, w) the token at each place
        of each padded piece (N, a zero appended, at the padding), (N,) each token's place
        among the P * w, and (P, w) bool, True at the pieces' own tokens. Made on the host
        from the lengths (no wait for the device), once per call and kind of pieces."""
        found = self._pieces.get(pieces)
        if found is None:
            lengths = torch.tensor(pieces.lengths)
            starts = torch.tensor([0, *accumulate(pieces.lengths)][:-1])
            places = torch.arange(max(pieces.lengths))
            keys = places[None, :] < lengths[:, None]
            where = torch.where(keys, starts[:, None] + places, sum(pieces.lengths))
            position = (torch.arange(len(lengths))[:, None] * len(places) + places)[keys]
            found = (where.to(device), position.to(device), keys.to(device))
            self._pieces[pieces] = found
        return found

    def _add_maps(
        self,
        stack: ColumnFolds | _ReadOutFolds,
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


class _ReadOutFolds:
    """The folds of a `ReadOut` set for every column, as `ColumnFolds` folds a set's: per
    chunk of columns (as the backward hands them over), a `ColumnFolds` of the columns'
    sinks, made from the rows the set `after` ends with once its folds of those columns
    are done (its blocks are nearer the score: they arrive first)."""

    def __init__(self, after: ColumnFolds, parts: list[ReadOut]) -> None:
        self.layers = parts[0].layers
        self.mode = after.mode  # the same method as the set it is read out by
        self._after = after
        self._parts = parts
        self._chunks: dict[int, ColumnFolds] = {}  # first column of a chunk -> its folds
        self._started = 0

    def fold(
        self, layer: int, columns: slice, spread: Callable[[Tensor], Tensor], rowsum: Tensor | None
    ) -> None:
        if layer not in self.layers:
            return
        start = columns.start or 0
        chunk = self._chunks.get(start)
        if chunk is None:
            chunk = self._chunks[start] = self._start(columns)
        chunk.fold(layer, slice(None), spread, rowsum)

    def _start(self, columns: slice) -> ColumnFolds:
        if self._after.expects(columns) is not None:
            raise RuntimeError("a set's block arrived before the fold it is read out by ended")
        rows = self._parts[0].readout(self._after.rows(columns))
        parts = self._parts[columns]
        chunk = ColumnFolds([part.start(row) for part, row in zip(parts, rows, strict=True)])  # type: ignore[misc]
        if chunk.mode != self.mode:
            raise RuntimeError("a set read out by another must fold by the same method")
        self._started += len(parts)
        return chunk

    def finish(self) -> None:
        if self._started != len(self._parts):
            raise RuntimeError("a block never arrived; cannot finish the folds")
        for chunk in self._chunks.values():
            chunk.finish()


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

        def stack(
            column_sinks: list[Sink | ReadOut], earlier: list[ColumnLastBlocks]
        ) -> ColumnLastBlocks | None:
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
    sinks: Sequence[PerSetSinks],
    stack: Callable[[list[Sink | ReadOut], list[Stack]], Stack | None],
) -> list[tuple[Sequence[int], Stack]] | None:
    """(the set's model-wide layers, `stack` of the columns' parts of that set, given the
    stacks of the sets before) per token set, or None where a column has no parts or
    `stack` refuses a set's parts (returns None, or raises ValueError: the methods or
    blocks differ between columns)."""
    parts = [sink.parts() for sink in sinks]
    if not all(parts):
        return None
    stacks: list[tuple[Sequence[int], Stack]] = []
    for index, (layers, _) in enumerate(parts[0]):
        try:
            made = stack([column[index][1] for column in parts], [s for _, s in stacks])
        except ValueError:
            return None
        if made is None:
            return None
        stacks.append((layers, made))
    return stacks


def _routes(stacks: list[tuple[Sequence[int], Stack]]) -> dict[int, tuple[Stack, int]]:
    """Each model-wide layer a stack takes -> (the stack, the layer within its set)."""
    return {layers[local]: (stack, local) for layers, stack in stacks for local in stack.layers}


def _into_pieces(tensor: Tensor, where: Tensor, batch_dim: int, token_dim: int) -> Tensor:
    """`tensor` with its tokens (dimension `token_dim`) cut into the padded pieces `where`
    (P, w) (explain.engine.spread.SpreadFold._piece_index), the pieces joined to the
    batch (dimension `batch_dim`, before the tokens): B -> B * P sequences of w tokens."""
    padding = list(tensor.shape)
    padding[token_dim] = 1
    padded = torch.cat([tensor, tensor.new_zeros(padding)], dim=token_dim)
    pieces = padded.index_select(token_dim, where.flatten()).unflatten(token_dim, where.shape)
    return pieces.movedim(token_dim, batch_dim + 1).flatten(batch_dim, batch_dim + 1)
