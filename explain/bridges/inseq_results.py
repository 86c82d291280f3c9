"""Generations' explanations as inseq's `FeatureAttributionOutput`, which inseq's
`attribute` returns and its `.show()`, `.aggregate()` and JSON `save` / `load` read.

inseq writes a decoder-only model's attribution as `target_attributions` of shape
(len(target), G): column g holds every token's score for the token generated at
`attr_pos_start + g`, and NaN from that token on (what it does not read), with the prompt
as `source` and no `source_attributions`. One score per token, as ours are, is inseq's
coarse kind (`CoarseFeatureAttributionSequenceOutput`, as its occlusion gives): `.show()`
draws it without aggregating.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from explain.bridges import require

__all__ = ["feature_attribution_output", "sequence_attribution"]


def sequence_attribution(
    tokens: Sequence[str],
    ids: Sequence[int],
    prompt_length: int,
    relevance: Tensor,
    probabilities: Tensor,
) -> Any:
    """One continuation as inseq's sequence output: `tokens` and `ids` the prompt's and
    the G generated ones, `relevance` (G, len(tokens)) row g every token's relevance for
    generated token g (zero from that token on), `probabilities` (G,) each generated
    token's probability (inseq's "probability" step score)."""
    attribution = require("inseq.data.attribution", "inseq")
    typing = require("inseq.utils.typing", "inseq")
    target = [typing.TokenWithId(token, int(i)) for token, i in zip(tokens, ids, strict=True)]
    scores = relevance.detach().cpu().T.clone()  # (len(tokens), G)
    generated = torch.arange(scores.shape[1]) + prompt_length
    unread = torch.arange(scores.shape[0])[:, None] >= generated[None, :]
    scores[unread] = float("nan")
    return attribution.CoarseFeatureAttributionSequenceOutput(
        source=target[:prompt_length],
        target=target,
        target_attributions=scores,
        step_scores={"probability": probabilities.detach().cpu()},
        attr_pos_start=prompt_length,
        attr_pos_end=len(target),
    )


def feature_attribution_output(sequences: Sequence[Any], info: Mapping[str, Any]) -> Any:
    """inseq's `FeatureAttributionOutput` of `sequence_attribution`s, with `info` (what
    produced them, as inseq's own `info` records it)."""
    attribution = require("inseq.data.attribution", "inseq")
    return attribution.FeatureAttributionOutput(
        sequence_attributions=list(sequences), info=dict(info)
    )
