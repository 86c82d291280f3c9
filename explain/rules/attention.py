"""Gradient-free, class-agnostic methods: raw attention and attention rollout."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from explain.errors import OptionError
from explain.rules.fold import ReadoutFold, RowSum, readout_fold
from explain.rules.registry import Need, RuleContext, SpreadMode, first_block, register_method

__all__ = [
    "discard_lowest",
    "fuse_heads",
    "raw_attention",
    "rollout",
    "rollout_split",
]

HeadFusion = Literal["mean", "max", "min"]
_HEAD_FUSIONS: tuple[str, ...] = ("mean", "max", "min")


def _check_head_fusion(head_fusion: str) -> None:
    if head_fusion not in _HEAD_FUSIONS:
        raise OptionError(f"head_fusion must be 'mean', 'max' or 'min', got {head_fusion!r}")


def fuse_heads(attention: Tensor, head_fusion: HeadFusion = "mean") -> Tensor:
    """(B, H, N, N) -> (B, N, N) by the mean, max or min over heads."""
    _check_head_fusion(head_fusion)
    if head_fusion == "mean":
        return attention.mean(dim=1)
    if head_fusion == "max":
        return attention.amax(dim=1)
    return attention.amin(dim=1)


def discard_lowest(matrix: Tensor, ratio: float, protected: Tensor) -> Tensor:
    """Zero the `int(N * ratio)` lowest entries of every row of (B, N, N) `matrix`.

    `protected` (..., B, N) marks the readout tokens, whose own (diagonal) entries are
    never dropped, as the rollout reference keeps the class token's attention to itself;
    the result has its leading dimensions (one matrix per column's readout rows).
    """
    count = int(matrix.shape[-1] * ratio)
    if count == 0:
        return matrix
    diagonal = torch.diag_embed(protected.to(torch.bool))
    ranked = matrix.masked_fill(diagonal, float("inf"))
    lowest = ranked.topk(count, dim=-1, largest=False).indices
    return (matrix if ranked.shape == matrix.shape else matrix.expand_as(ranked)).scatter(
        -1, lowest, 0.0
    )


def rollout_split(rows: Tensor, rowsum: RowSum) -> tuple[Tensor, Tensor]:
    """v @ ((M + I) / rowsum(M + I)) without building I: with s = v / rowsum, s @ M + s;
    s spreads through M and is kept (explain.rules.fold.Split). A row of a head mean of
    attention sums to 1 (`rowsum` None), or to 0 where every key of it is masked."""
    sums = rowsum()
    scaled = rows / 2.0 if sums is None else rows / (sums.to(rows.dtype) + 1.0)
    return scaled, scaled


def _spread_only(rows: Tensor, rowsum: RowSum) -> tuple[Tensor, None]:
    """v @ M: v spreads, nothing is kept (explain.rules.fold.Split)."""
    return rows, None


@register_method("raw_attention", needs={Need.ATTENTION}, class_specific=False)
def raw_attention(context: RuleContext) -> ReadoutFold:
    """The readout row of the last block's head-averaged attention.

    A fold over the last block alone, `v @ mean_h A`: so every column of a call (the
    generated tokens of a generation) is read out by one spread, from the recorded map or
    from q and k without it (explain.engine.spread)."""
    last = range(context.num_layers - 1, context.num_layers)
    return readout_fold(context, last, _head_mean, _spread_only, spread=SpreadMode.ATTENTION)


def _head_mean(attention: Tensor, gradient: Tensor | None) -> Tensor:
    return attention.mean(dim=1)


@register_method(
    "rollout", needs={Need.ATTENTION}, class_specific=False, default_start_layer=first_block
)
def rollout(
    context: RuleContext, head_fusion: HeadFusion = "mean", discard_ratio: float = 0.0
) -> ReadoutFold:
    """Attention rollout (Abnar & Zuidema 2020): product of row-normalised (A + I)."""
    _check_head_fusion(head_fusion)  # before any forward; no tensor op
    if not 0.0 <= discard_ratio < 1.0:
        raise OptionError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    readout = context.readout  # one matrix for every column where they share their rows
    protected = (readout[0] if len(readout) == 1 else readout) > 0 if discard_ratio else None

    def block_matrix(attention: Tensor, gradient: Tensor | None) -> Tensor:
        fused = fuse_heads(attention, head_fusion)
        return fused if protected is None else discard_lowest(fused, discard_ratio, protected)

    if discard_ratio and context.layout.windows:
        raise OptionError(
            "discard_ratio ranks each attention row over all of a block's tokens, but a "
            "windowed model's (Swin) rows cover one window each; leave discard_ratio at 0 "
            "for this model"
        )
    layers = range(context.start_layer, context.num_layers)
    # Only the head mean without discarding is a spread of A (explain.engine.kernels);
    # max, min and discarding need the block's whole map.
    spread = SpreadMode.ATTENTION if head_fusion == "mean" and not discard_ratio else None
    return readout_fold(context, layers, block_matrix, rollout_split, spread=spread)
