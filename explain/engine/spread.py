"""Every block of a call handed to the call's fold as the block's path has it: an explicit
map as it is; a fused block (q, k, v, mask, dO) as the product `u @ Abar` where the fold
takes one (`Fold.spread`), streamed from those tensors without any N x N map
(explain.engine.kernels), or else as its whole maps, recomputed. docs/architecture.md
("Folds") says which methods stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import accumulate

import torch
from torch import Tensor

from explain.engine.fused import FusedBlock, attention_gradient
from explain.engine.kernels import live_rows, readout_spread
from explain.layout import Pieces
from explain.rules.fold import compute_dtype
from explain.rules.registry import Fold, SpreadMode

__all__ = ["FoldFeed"]


class FoldFeed:
    """A `explain.engine.recorder.BlockCallback` that hands every block of a call to the
    call's `fold` (module docstring). `max_bytes` bounds the temporaries of a fused block: its
    spread's, or its dA's when recomputed whole (for as many columns at a time as fit)."""

    def __init__(self, fold: Fold, max_bytes: int) -> None:
        self._call_fold = fold
        self._layers = frozenset(fold.layers)
        self._max_bytes = max_bytes
        self._masks: dict[int, tuple[Tensor, Tensor | None, bool]] = {}
        self._pieces: dict[Pieces, tuple[Tensor, Tensor, Tensor]] = {}

    @property
    def streams(self) -> bool:
        """Whether every block of the call is taken as a product: on the fused path, the
        call then builds no N x N map ("streamed")."""
        return bool(self._layers) and self._call_fold.spread is not None

    @torch.no_grad()
    def add(
        self, layer: int, columns: slice, record: FusedBlock | Tensor, gradient: Tensor | None
    ) -> None:
        """Block `layer` for `columns` from its record, outside autograd: a block's q and k
        may be part of the model's graph (a probe shows the kernel's own), and a fold on
        them would keep every chunk's temporaries alive."""
        if layer not in self._layers:
            return
        if isinstance(record, Tensor):
            self._call_fold.add(layer, columns, record, gradient)
            return
        mode = self._call_fold.spread
        if mode is not None:
            grad = gradient if mode is SpreadMode.GRADIENT else None
            if isinstance(record.mask, Pieces):
                self._fold_pieces(layer, columns, record, record.mask, grad, mode)
                return
            key_mask, exact = self._key_mask(record)
            if exact:  # else the mask is more than keys and causality: whole maps
                self._fold_block(layer, columns, record, key_mask, grad, mode)
                return
        for part, attention, maps in _whole_maps(columns, record, gradient, self._max_bytes):
            self._call_fold.add(layer, part, attention, maps)

    def _fold_block(
        self,
        layer: int,
        columns: slice,
        block: FusedBlock,
        key_mask: Tensor | None,
        grad: Tensor | None,
        mode: SpreadMode,
    ) -> None:
        query, key, value = block.tensors()
        live = live_rows(key_mask, block.site.causal)

        def spread(rows: Tensor) -> Tensor:
            return readout_spread(
                rows,
                query,
                key,
                value,
                grad,
                scale=block.site.scale,
                causal=block.site.causal,
                key_mask=key_mask,
                mode=mode,
                max_bytes=self._max_bytes,
            )

        def rowsum() -> Tensor | None:  # a row sums to 1 unless every key of it is masked
            return None if live is None else live.expand(query.shape[0], -1)

        self._call_fold.fold(layer, columns, spread, rowsum)

    def _fold_pieces(
        self,
        layer: int,
        columns: slice,
        block: FusedBlock,
        pieces: Pieces,
        grad: Tensor | None,
        mode: SpreadMode,
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
                mode=mode,
                max_bytes=self._max_bytes,
            )
            return folded.unflatten(1, (batch, -1)).flatten(2).index_select(-1, position)

        self._call_fold.fold(layer, columns, spread, _every_piece_has_keys)

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


def _every_piece_has_keys() -> None:
    """The row sums of a block in pieces (`RowSum`): every piece has keys, so every row
    sums to 1."""
    return None


def _whole_maps(
    columns: slice, record: FusedBlock, gradient: Tensor | None, max_bytes: int
) -> Iterator[tuple[slice, Tensor, Tensor | None]]:
    """A fused block's whole maps for `columns`: (columns, A (B, H, N, N), their dA (c, B,
    H, N, N) or None), A recomputed once, dA = dO v^T for as many columns at a time as fit
    `max_bytes` (the explicit path's chunks of columns hold as much)."""
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
        maps = attention_gradient(part.to(attention.dtype), value)
        yield slice(start + first, start + first + len(part)), attention, maps


def _into_pieces(tensor: Tensor, where: Tensor, batch_dim: int, token_dim: int) -> Tensor:
    """`tensor` with its tokens (dimension `token_dim`) cut into the padded pieces `where`
    (P, w) (`FoldFeed._piece_index`), the pieces joined to the batch (dimension
    `batch_dim`, before the tokens): B -> B * P sequences of w tokens."""
    padding = list(tensor.shape)
    padding[token_dim] = 1
    padded = torch.cat([tensor, tensor.new_zeros(padding)], dim=token_dim)
    pieces = padded.index_select(token_dim, where.flatten()).unflatten(token_dim, where.shape)
    return pieces.movedim(token_dim, batch_dim + 1).flatten(batch_dim, batch_dim + 1)
