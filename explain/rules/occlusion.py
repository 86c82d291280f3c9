"""Occlusion (Zeiler & Fergus, ECCV 2014; leave-one-out for text, Li, Monroe & Jurafsky
2016): the spans each copy replaces, each span's drop shared out over its tokens
(`SpanDrops`, one copy of the inputs per span, run by the engine's copies pass), and the
method's fold. docs/methods.md ("The baselines") says how spans are given.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from explain.errors import OptionError
from explain.layout import TokenLayout
from explain.rules.lrp_based import InputRelevance
from explain.rules.registry import (
    CopiesSeen,
    Need,
    RuleContext,
    embedding_baseline,
    register_method,
)

__all__ = [
    "SeenRelevance",
    "SpanDrops",
    "check_spans",
    "occluded_spans",
    "occlusion",
    "span_relevance",
]


def check_spans(spans: Tensor | None, layout: TokenLayout, batch: int) -> tuple[int, ...]:
    """The input-space shape of the tokens `spans` name (`occluded_spans`), once `spans`
    is checked to be None or a tensor of integers of that shape (without reading its
    values); OptionError otherwise."""
    shape = layout.grid if layout.modality == "image" else (layout.num_tokens,)
    assert shape is not None  # an image layout has its grid
    if spans is None:
        return tuple(shape)
    if not isinstance(spans, Tensor) or spans.is_floating_point() or spans.is_complex():
        raise OptionError("spans must be a tensor of integer span ids (-1: in no span)")
    if tuple(spans.shape) not in (tuple(shape), (batch, *shape)):
        raise OptionError(
            f"spans must have shape {tuple(shape)} or {(batch, *shape)} (a span id per "
            f"{'token' if layout.modality == 'text' else 'patch'}), got {tuple(spans.shape)}"
        )
    return tuple(shape)


def occluded_spans(spans: Tensor | None, layout: TokenLayout, batch: int) -> Tensor:
    """(S, B, P) bool: which of the P embedded tokens (a text's positions, an image's
    patches in row-major order; no prefix token) copy s replaces, one copy per span.

    `spans` gives each token's span as an integer, in input space: (B, T) or (T,) for
    text, (B, gh, gw) or (gh, gw) for an image's patches; -1 for tokens in no span
    (never replaced, relevance 0). The copies follow the distinct span ids in increasing
    order. None: every token its own span."""
    count = int(torch.Size(check_spans(spans, layout, batch)).numel())
    if spans is None:
        return torch.eye(count, dtype=torch.bool)[:, None, :].expand(count, batch, count)
    spans = spans.long().reshape(-1, count).expand(batch, count).cpu()
    ids = spans.unique().tolist()  # sorted: one look at the values
    if ids[0] < -1:
        raise OptionError("span ids must be >= 0, or -1 for tokens in no span")
    ids = ids[1:] if ids[0] == -1 else ids
    if not ids:
        raise OptionError("spans name no span: every token is -1")
    return spans[None] == torch.tensor(ids)[:, None, None]


def span_relevance(drops: Tensor, occluded: Tensor) -> Tensor:
    """(K, B, P) token relevance from the (S, B, K) drops of the S copies and the (S, B, P)
    tokens each replaced: each token gets its span's drop over the span's size."""
    weights = occluded.to(drops.dtype)
    sizes = weights.sum(dim=-1, keepdim=True).clamp(min=1)  # (S, B, 1)
    return torch.einsum("sbk,sbp->kbp", drops, weights / sizes)


class SeenRelevance(InputRelevance):
    """The fold of occlusion: a token the column does not see (`TokenLayout.token_mask`:
    a pad, or a token after a generated token's position) gets 0. Replacing it changes
    the score by nothing but the rounding of another forward's batch, which would
    otherwise show as relevance."""

    def __init__(self, context: RuleContext) -> None:
        super().__init__(context)
        self._seen = context.layout.token_mask

    def add_input(self, columns: slice, relevance: Tensor) -> None:
        seen = self._seen  # (B, N), or (C, B, N) where each column sees its own tokens
        if seen is not None:
            if seen.dim() == 3 and seen.shape[0] > 1:
                seen = seen[columns]
            relevance = relevance * seen.to(relevance.device, relevance.dtype)
        super().add_input(columns, relevance)


class SpanDrops:
    """One copy of the inputs per span, the span's embeddings replaced by the baseline's
    (a `CopiesMethod`, forwards without a backward); each span's drop of every column's
    score shared out over its tokens (`span_relevance`)."""

    backward = False
    linear_in_score = True
    baseline_score = False

    def __init__(
        self, layout: TokenLayout, batch: int, *, baseline_token: int | None, spans: Tensor | None
    ) -> None:
        self.baseline = embedding_baseline(baseline_token, layout.modality)
        self._spans = occluded_spans(spans, layout, batch)
        self.count = len(self._spans)
        self._batch = batch
        self._total: Tensor | None = None

    def weights(self, copies: range) -> Tensor:
        return (~self._spans[copies.start : copies.stop]).float()

    def shift(self, copies: range, inputs: Tensor) -> None:
        return None

    def start(self, scores: Tensor, at_baseline: Tensor | None) -> None:
        self._scores = scores
        dtype = scores.dtype if scores.dtype == torch.float64 else torch.float32
        self._total = scores.new_zeros(
            (scores.shape[1], self._batch, self._spans.shape[-1]), dtype=dtype
        )

    def add(self, copies: range, columns: slice, scores: Tensor, gradients: Tensor | None) -> None:
        assert self._total is not None
        occluded = self._spans[copies.start : copies.stop].to(scores.device)
        replaced = scores.unflatten(0, (len(copies), self._batch))
        self._total += span_relevance(
            (self._scores[None] - replaced).to(self._total.dtype), occluded
        )

    def finish(self, seen: CopiesSeen) -> tuple[Tensor, dict[str, Any]]:
        assert self._total is not None
        return seen.on_layout(self._total), {"baseline": self.baseline.describe()}


@register_method("occlusion", needs={Need.EMBEDDING_COPIES}, class_specific=True, copies=SpanDrops)
def occlusion(
    context: RuleContext, baseline_token: int | None = None, spans: Tensor | None = None
) -> SeenRelevance:
    """Occlusion: the score's drop when a token, patch or span is replaced (leave one out)."""
    embedding_baseline(baseline_token, context.layout.modality)  # refused before any forward
    check_spans(spans, context.layout, context.readout.shape[1])  # its values: by the pass
    return SeenRelevance(context)
