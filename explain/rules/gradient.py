"""Gradient-weighted, class-specific methods: the generic rule (ICCV 2021) and attention
GradCAM (the baseline of both papers)."""

from __future__ import annotations

from torch import Tensor

from explain.rules.fold import LastBlock, ReadoutFold, RowSum, last_block, readout_fold
from explain.rules.registry import Need, RuleContext, SpreadMode, first_block, register_method

__all__ = [
    "attention_gradcam",
    "generic",
    "generic_split",
    "gradcam_maps",
    "gradient_weighted",
]


def gradient_weighted(attention: Tensor, gradient: Tensor | None) -> Tensor:
    """Abar = mean_h (G * A)+ : clamp per head before the head mean (rules 5 and 6).

    `attention` is (B, H, N, M); `gradient` is (B, H, N, M), or (C, B, H, N, M) for C
    score columns at once, which share the attention: Abar is then (C, B, N, M).
    Summed one head at a time: the call then holds one (B, N, N) temporary instead of two
    (B, H, N, N) ones, which are the largest allocations of the explicit path's backward
    (they set its peak memory).
    """
    assert gradient is not None
    heads = attention.shape[-3]
    total = (gradient.select(-3, 0) * attention.select(-3, 0)).clamp_(min=0)
    for head in range(1, heads):
        total += (gradient.select(-3, head) * attention.select(-3, head)).clamp_(min=0)
    return total.div_(heads)


def generic_split(rows: Tensor, rowsum: RowSum) -> tuple[Tensor, Tensor]:
    """v @ (I + Abar) = v @ Abar + v, the readout rows of R <- R + Abar @ R: v spreads
    through Abar and is kept (explain.rules.fold.Split)."""
    return rows, rows


@register_method(
    "generic",
    needs={Need.ATTENTION, Need.ATTENTION_GRADIENTS},
    class_specific=True,
    default_start_layer=first_block,
)
def generic(context: RuleContext) -> ReadoutFold:
    """Chefer, Gur & Wolf ICCV 2021: R = prod (I + mean_h (G * A)+) over the blocks."""
    layers = range(context.start_layer, context.num_layers)
    return readout_fold(
        context, layers, gradient_weighted, generic_split, spread=SpreadMode.GRADIENT
    )


@register_method(
    "attention_gradcam", needs={Need.ATTENTION, Need.ATTENTION_GRADIENTS}, class_specific=True
)
def attention_gradcam(context: RuleContext) -> LastBlock:
    """GradCAM on the last block's attention: head weights = mean readout-row gradient."""
    readout = context.readout
    keys = context.layout.last_block_keys(readout.shape[1], readout.device).expand_as(readout)
    return last_block(context, gradcam_maps, readout, keys)


def gradcam_maps(rows: tuple[Tensor, ...], attention: Tensor, gradients: Tensor | None) -> Tensor:
    """Attention GradCAM of c columns at once (a `LastBlockMap`): for each column's readout
    row r and kept keys, `(mean_h w_h * r @ A_h)+` with `w_h` the mean of `r @ G_h` over the
    kept keys. Rows (c, B, N), attention (B, H, N, N), gradients (c, B, H, N, N)."""
    assert gradients is not None
    readouts, keys = rows
    readouts = readouts.to(attention.dtype)
    # r @ A_h for every column and head: the columns share A (B, H, N, N), which is read
    # as it is, while the rows (C, B, N) are small enough to repeat per head.
    attention_rows = (readouts.transpose(0, 1)[:, None] @ attention).permute(2, 0, 1, 3)
    gradient_rows = (readouts[:, :, None, None, :] @ gradients).squeeze(-2)  # (C, B, H, N)
    kept = keys[:, :, None, :].to(attention.dtype)
    weights = (gradient_rows * kept).sum(dim=-1, keepdim=True) / kept.sum(dim=-1, keepdim=True)
    return (weights * attention_rows).mean(dim=2).clamp(min=0)
