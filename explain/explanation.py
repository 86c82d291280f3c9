"""Results: `Explanation` (relevance maps) and `Trace` (raw per-layer tensors)."""

from __future__ import annotations

import operator
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from explain.errors import ExplainError, OptionError
from explain.finite import check_finite

__all__ = ["Explanation", "Trace", "normalize_per_sample"]


def normalize_per_sample(maps: Tensor, sample_dims: int) -> Tensor:
    """Min-max normalise each map over its last `sample_dims` axes to [0, 1].

    A constant map becomes all zeros instead of dividing by zero.
    """
    flat = maps.flatten(start_dim=maps.dim() - sample_dims)
    low = flat.amin(dim=-1, keepdim=True)
    span = flat.amax(dim=-1, keepdim=True) - low
    scaled = torch.where(span > 0, (flat - low) / span.clamp(min=torch.finfo(flat.dtype).tiny), 0.0)
    return scaled.reshape(maps.shape)


def _heatmap_size(size: object) -> tuple[int, int]:
    """A heatmap size as (H, W) of positive ints: one int for a square, or a pair."""
    pair = (size, size) if not isinstance(size, tuple | list) else tuple(size)
    if len(pair) == 2 and not any(isinstance(v, bool) for v in pair):
        try:
            height, width = (operator.index(v) for v in pair)  # type: ignore[arg-type]
        except TypeError:
            pass
        else:
            if height > 0 and width > 0:
                return height, width
    raise OptionError(
        f"heatmap size must be a positive int or a (height, width) pair of positive ints, "
        f"got {size!r}"
    )


@dataclass(frozen=True)
class Explanation:
    """The relevance of each input element for the explained class of each sample.

    Attributes:
        relevance: detached relevance. Images: (B, gh, gw) over the patch grid with prefix
            tokens dropped ("lrp": (B, H, W) pixels); text: (B, T) with pads exactly 0.
            With K targets per input a K axis follows the batch axis.
        logits: (B, C) model output of the explained forward pass.
        target: (B,) or (B, K) explained classes (-1 where a callable chose the score).
        method: name of the method that produced the relevance.
        score: what was differentiated ("logit", "probability", "log_probability").
        input_size: (H, W) of the input images, None for text.
        relevances: every input's relevance by modality; a single-input model has one
            entry, the same tensor as `relevance`.
        tokens: per sample, the token strings, when the Explainer has a tokenizer.
    """

    relevance: Tensor
    logits: Tensor
    target: Tensor
    method: str
    score: str
    input_size: tuple[int, int] | None = None
    relevances: Mapping[str, Tensor] = field(default_factory=dict)
    tokens: list[list[str]] | None = None

    def __post_init__(self) -> None:
        # Refused here, where every runner's result passes, so that no NaN is ever drawn
        # (min-max normalisation would hide it as zeros, a colour scale show it as red).
        for relevance in (self.relevance, *self.relevances.values()):
            check_finite(
                relevance,
                f"the {self.method} relevance",
                "the method's arithmetic overflowed for these inputs; explain them with a "
                "float32 (or float64) model, or with another method",
                error=ExplainError,
            )

    def heatmap(self, size: tuple[int, int] | int | None = None) -> Tensor:
        """Relevance upsampled bilinearly to `size` (default: the input size) and min-max
        normalised per map to [0, 1]; shape (B, H, W), or (B, K, H, W)."""
        if self.input_size is None:
            raise ExplainError("heatmap() is for image explanations; text relevance is per token")
        size = self.input_size if size is None else _heatmap_size(size)
        maps = self.relevance.float() if self.relevance.dtype != torch.float64 else self.relevance
        lead = maps.shape[:-2]
        grid = maps.reshape(-1, 1, *maps.shape[-2:])
        if tuple(grid.shape[-2:]) != tuple(size):
            grid = F.interpolate(grid, size=size, mode="bilinear", align_corners=False)
        return normalize_per_sample(grid.reshape(*lead, *size), sample_dims=2)

    def to_html(self, skip: Collection[str] = ()) -> str:
        """A text explanation as an HTML page: every text's tokens highlighted on a
        diverging scale, each token escaped. `skip`: tokens not shown (e.g. the
        tokenizer's `all_special_tokens`). See explain.viz.text."""
        if self.tokens is None or self.relevance.dim() != 2:
            raise ExplainError(
                "to_html() is for text explanations with one map per text: create the "
                "Explainer with a tokenizer, and pick one target per text"
            )
        from explain.viz.text import document_html, to_html

        return document_html(
            [
                to_html(tokens, scores, skip=skip, title=f"text {index}: target {int(target)}")
                for index, (tokens, scores, target) in enumerate(
                    zip(self.tokens, self.relevance.cpu(), self.target.cpu(), strict=True)
                )
            ]
        )


@dataclass(frozen=True)
class Trace:
    """Every block's attention and hidden states, with their gradients, for one score.

    `attentions[l]` and `attention_grads[l]` are (B, H, N, N) for block l;
    `hidden_states[0]` is the input of block 0 and `hidden_states[l + 1]` the output of
    block l, each (B, N, D), as in Hugging Face's `output_hidden_states`. The gradients
    are of `sum_b score_b` and so, sample by sample, of each sample's own score.
    All tensors are detached.
    """

    attentions: tuple[Tensor, ...]
    attention_grads: tuple[Tensor, ...]
    hidden_states: tuple[Tensor, ...]
    hidden_state_grads: tuple[Tensor, ...]
    logits: Tensor
    target: Tensor
    score: str
