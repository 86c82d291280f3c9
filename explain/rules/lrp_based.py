"""The LRP-based methods of Chefer, Gur & Wolf (CVPR 2021): transformer attribution and the
paper's two LRP baselines. Their relevance pass lives in explain.lrp; the folds here only
aggregate what it delivers: each block's attention relevance RA_l (in place of A_l) with
its gradient G_l, or the relevance of the input itself."""

from __future__ import annotations

from torch import Tensor

from explain.rules.attention import rollout_split
from explain.rules.fold import LastBlock, ReadoutFold, compute_dtype, joined
from explain.rules.gradient import generic_split
from explain.rules.registry import Need, RuleContext, SpreadMode, register_method

__all__ = [
    "InputRelevance",
    "lrp",
    "partial_lrp",
    "partial_lrp_maps",
    "transformer_attribution",
]


def attribution_start(num_layers: int, modality: str) -> int:
    """All blocks for images; the last block only for text (the reference's ERASER setting)."""
    return num_layers - 1 if modality == "text" else 0


@register_method(
    "transformer_attribution",
    needs={Need.LRP_RELEVANCE, Need.ATTENTION_GRADIENTS},
    class_specific=True,
    default_start_layer=attribution_start,
    lrp_rules="transformer_attribution",
)
def transformer_attribution(context: RuleContext) -> ReadoutFold:
    """Chefer, Gur & Wolf CVPR 2021: prod (I + mean_h (G * R_A)+), R_A the LRP relevance of A."""
    layers = range(context.start_layer, context.num_layers)
    # The text reference row-normalises (Abar + I), exactly the rollout step; ViT does not.
    split = rollout_split if context.layout.modality == "text" else generic_split
    return ReadoutFold(context.readout, layers, relevance_weighted, split)


def relevance_weighted(relevance: Tensor, gradients: Tensor | None) -> Tensor:
    """Abar = mean_h (G * R_A)+ for the columns' gradients (c, B, H, N, N), all heads in
    one batched product: the LRP walk holds R_A (B, H, N, N) while the block folds anyway,
    so the head-by-head sum that keeps the gradient methods' peak memory low
    (explain.rules.gradient) would save nothing here and cost a dispatched op per head."""
    assert gradients is not None
    return (gradients * relevance).clamp_(min=0).mean(dim=-3)


@register_method(
    "partial_lrp", needs={Need.LRP_RELEVANCE}, class_specific=True, lrp_rules="original"
)
def partial_lrp(context: RuleContext) -> LastBlock:
    """Partial LRP: the readout row of the last block's mean_h (R_A)+ (original LRP rules)."""
    return LastBlock(context.num_layers, partial_lrp_maps, context.readout)


def partial_lrp_maps(
    rows: tuple[Tensor, ...], relevance: Tensor, gradients: Tensor | None
) -> Tensor:
    """The readout rows (c, B, N) of mean_h (R_A)+ (a `LastBlockMap`; no gradient)."""
    (readouts,) = rows
    fused = relevance.clamp(min=0).mean(dim=1)  # (B, N, N)
    return (readouts.transpose(0, 1).to(fused.dtype) @ fused).transpose(0, 1)


class InputRelevance:
    """Fold of the methods that use no block record, only the relevance of the input: full
    LRP (`Need.INPUT_RELEVANCE`, as the family's walk returns it: pixels (B, H, W) for a
    timm ViT, tokens (B, N) for BERT), Gradient x Input, plain or under the rules of
    AttnLRP and CP-LRP (`Need.EMBEDDING_GRADIENTS`), the methods that run copies of the
    inputs (`Need.EMBEDDING_COPIES`: integrated gradients, occlusion): tokens (B, N) at the
    embedding output; per chunk of columns (`Fold.add_input`)."""

    layers = range(0)
    spread: SpreadMode | None = None

    def __init__(self, context: RuleContext) -> None:
        self._relevance: dict[int, Tensor] = {}  # first column of a chunk -> its relevance

    def add(self, layer: int, columns: slice, attention: Tensor, gradients: Tensor | None) -> None:
        """These methods use no block records."""

    def add_input(self, columns: slice, relevance: Tensor) -> None:
        self._relevance[columns.start or 0] = relevance.to(compute_dtype(relevance))

    def result(self) -> Tensor:
        return joined(self._relevance)


@register_method(
    "lrp",
    needs={Need.INPUT_RELEVANCE},
    class_specific=True,
    lrp_rules="original",
    scale_note=(
        "full LRP with the original rules (the CVPR 2021 paper's baseline) does not "
        "conserve relevance: its values can be orders of magnitude larger than the "
        "explained logit and of either sign, so only their ratios within one map mean "
        "anything"
    ),
)
def lrp(context: RuleContext) -> InputRelevance:
    """Full LRP (original rules) down to the input: pixels (B, H, W) for images."""
    return InputRelevance(context)
