"""How far to trust a span ranking for one answer: ContextCite's checks, by ablation.

The target is the answer's log-probability given the prompt (for a contrast, the
answer's minus the foil's). Ablating a set of spans REMOVES their tokens from the
prompt: the rest of the prompt (the template, the question, the other spans) is kept in
order, and the answer follows it; the tokenization is the full prompt's (the tokens of
the removed spans are cut out, nothing is re-tokenized). Then

- the top-k drop: the target with the whole context minus the target without the k
  spans that the ranking puts first (k = 1, 3, 5, those below the number of spans),
  against the mean and standard deviation of the drop without k random spans; a ranking
  worth reading drops the answer far more than chance. The random baseline is exact
  where the k-sets of spans are few: when there are at most `draws` of them, every k-set
  is removed once and the spread is their population standard deviation; otherwise
  `draws` k-sets are drawn at random and the spread is estimated from them (n - 1
  denominator). Where the k-th and (k + 1)-th scores tie, the top-k set is one choice
  among tied spans (`TopKDrop.tied`), not the ranking's;
- the linear datamodeling score (LDS, `lds` > 0): N random ablations, each keeping each
  span with probability 1/2; the Spearman correlation between the sum of the kept spans'
  scores and the target under that ablation (Cohen-Wang et al., "ContextCite", NeurIPS
  2024). 1 is a perfectly ranked linear account of the answer, 0 none.

Each ablation's sequence holds the kept tokens packed to the left, the answer after them,
padding on the right, where the causal mask alone keeps every real token from the pads:
the model runs with no attention mask where its adapter allows it
(`LanguageModel.right_padded_logits_at`), on its causal kernel. The sequences are built
and run one chunk of at most `batch_tokens` padded tokens at a time (memory bounded by
the chunk, not by the number of ablations), the longest first, so that the ablations
without half of the spans share chunks of their own width instead of padding to the
whole context's; on the model's fused attention path where its adapter has one (they
need no attention maps; transformers' eager path, which the maps need, computes Llama's
softmax in float32 even for a float64 model).
The random draws come from their own generator (`seed`), never the global RNG.
`check_scores` is the same check over any sources given a function that scores
ablations: a photo's regions (explain.cite.image) are removed by filling their pixels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from explain.architectures.base import LanguageModel
from explain.cite.verdict import ABLATION, Check, TopKDrop
from explain.engine import Session
from explain.errors import OptionError

__all__ = [
    "ABLATION",
    "TOP_K",
    "Check",
    "TopKDrop",
    "ablated_targets",
    "check_ranking",
    "check_scores",
    "check_seed",
    "kept_tokens",
    "spearman",
]

TOP_K = (1, 3, 5)
DRAWS = 16
"""Random span sets per k that the top-k drop is compared with."""
BATCH_TOKENS = 1 << 13
"""The most tokens one batched ablation forward takes (rows x sequence length). On CPU
larger chunks cost more per token once their activations leave the cache: the check of
recall-llama at 2,048 tokens (--lds 64) took 79 forwards' time in chunks of 8,192
tokens and 16,384, and 106 in chunks of 32,768 (CPU time, one thread)."""


SEEDS = 1 << 64
"""The check's seeds are 0 <= seed < 2**64 (torch.Generator.manual_seed's range)."""


def check_seed(seed: object) -> int:
    """`seed` when it is an int in [0, 2**64); OptionError otherwise, before any work (a
    float, a string or a bool is no seed: torch would truncate 1.5, and refuse "3" or a
    seed past 64 bits with an error that does not say which argument)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEEDS:
        raise OptionError(f"seed must be a whole number from 0 to 2**64 - 1, got {seed!r}")
    return seed


def _ranks(values: Tensor) -> Tensor:
    """Ranks from 1, ties given their mean rank."""
    below = (values[None, :] < values[:, None]).sum(dim=1).double()
    equal = (values[None, :] == values[:, None]).sum(dim=1).double()
    return below + (equal + 1) / 2


def spearman(x: Tensor, y: Tensor) -> float | None:
    """Spearman's rank correlation of two (N,) tensors (ties: mean ranks), in float64;
    None where either is constant (the correlation is undefined)."""
    rx, ry = _ranks(x.double()), _ranks(y.double())
    rx, ry = rx - rx.mean(), ry - ry.mean()
    norm = rx.norm() * ry.norm()
    return None if float(norm) == 0.0 else float((rx * ry).sum() / norm)


def _ablated_rows(
    prompt_ids: Tensor, token_spans: Tensor, keep: Tensor, answer: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The sequences, real-token counts and answer positions of the ablations `keep`
    (R, S) of one answer: (R, W), (R,) and (R, G), W the longest kept prompt plus the
    answer (no column of padding only). No integer tensor is larger than the sequences."""
    count = answer.shape[0]
    kept = kept_tokens(token_spans, keep)  # (R, P) bool
    lengths = kept.sum(dim=1)  # (R,)
    row, token = kept.nonzero(as_tuple=True)  # the kept tokens, row by row, in order
    column = torch.arange(row.shape[0]) - (lengths.cumsum(dim=0) - lengths)[row]
    sequences = prompt_ids.new_zeros(keep.shape[0], int(lengths.max()) + count)
    sequences[row, column] = prompt_ids.to(row.device)[token]
    at = lengths[:, None] + torch.arange(count)  # (R, G): where the answer goes
    sequences.scatter_(1, at, answer.to(sequences.device).expand(keep.shape[0], -1))
    return sequences, lengths + count, at


def kept_tokens(token_spans: Tensor, keep: Tensor) -> Tensor:
    """(R, P): whether each prompt token is kept by each ablation `keep` (R, S)."""
    spans = token_spans.to(keep.device)
    return torch.where(spans >= 0, keep[:, spans.clamp(min=0)], True)


def _chunks(widths: Tensor, batch_tokens: int) -> list[Tensor]:
    """Row indices in chunks of at most `batch_tokens` padded tokens (one row at least):
    the rows by decreasing width, so that a chunk pads its rows to widths close to its
    own (the check's rows without one span beside those without half of them)."""
    order = widths.argsort(descending=True, stable=True).tolist()
    chunks, first = [], 0
    while first < len(order):
        rows = max(1, batch_tokens // int(widths[order[first]]))
        chunks.append(torch.tensor(order[first : first + rows]))
        first += rows
    return chunks


def ablated_targets(
    adapter: LanguageModel,
    prompt_ids: Tensor,
    token_spans: Tensor,
    answers: Sequence[tuple[Tensor, float]],
    keep: Tensor,
    batch_tokens: int = BATCH_TOKENS,
) -> Tensor:
    """The target under each ablation: (M,) for `keep` (M, S) (span s kept in ablation m).

    `prompt_ids` (P,) with `token_spans` (P,) (-1: a token of no span, always kept);
    `answers`: (answer ids (G,), weight) pairs, the target being the weighted sum of the
    answers' log-probabilities (one answer with weight 1; a contrast, the foil's -1).
    The ablated sequences are built one chunk at a time, so memory is bounded by
    `batch_tokens`, not by M x P."""
    total = torch.zeros(keep.shape[0], dtype=torch.float64)
    inside = token_spans >= 0
    sizes = torch.bincount(token_spans[inside], minlength=keep.shape[1]).double()
    kept = (keep.double() @ sizes).long() + int((~inside).sum())  # (M,) prompt tokens
    for answer, weight in answers:
        with Session(adapter, fused=adapter.fused_path()):
            for rows in _chunks(kept + answer.shape[0], batch_tokens):
                sequences, lengths, at = _ablated_rows(prompt_ids, token_spans, keep[rows], answer)
                logits = adapter.right_padded_logits_at(
                    sequences, lengths, (at - 1).to(adapter.parameter.device)
                ).double()
                chosen = logits.log_softmax(dim=-1).gather(
                    -1, answer.to(logits.device).expand(logits.shape[0], -1)[..., None]
                )
                total[rows] += weight * chosen[..., 0].sum(dim=1).cpu()
    return total


def check_ranking(
    adapter: LanguageModel,
    prompt_ids: Tensor,
    token_spans: Tensor,
    answers: Sequence[tuple[Tensor, float]],
    scores: Tensor,
    *,
    target: str = "log p(answer)",
    lds: int = 0,
    draws: int = DRAWS,
    seed: int = 0,
    batch_tokens: int = BATCH_TOKENS,
) -> Check:
    """The check (module doc) of the span `scores` (S,) of one answer; every ablation
    (the full context, the top-k sets, the random sets, the LDS ablations) in one batch
    of forwards (`ablated_targets`)."""

    def targets(keep: Tensor) -> Tensor:
        return ablated_targets(adapter, prompt_ids, token_spans, answers, keep, batch_tokens)

    return check_scores(scores, targets, target=target, lds=lds, draws=draws, seed=seed)


def check_scores(
    scores: Tensor,
    targets: Callable[[Tensor], Tensor],
    *,
    target: str = "log p(answer)",
    lds: int = 0,
    draws: int = DRAWS,
    seed: int = 0,
    ablation: str = ABLATION,
) -> Check:
    """The check (module doc) of the `scores` (S,) of any sources, text spans or a
    photo's regions: `targets` maps the ablations `keep` (M, S) (source s kept in
    ablation m; row 0 keeps every source) to the target under each, (M,), and is called
    once; `ablation` says how it removes a source."""
    if isinstance(lds, bool) or not isinstance(lds, int) or lds < 0:
        raise OptionError(f"lds is a number of random ablations (0: none), got {lds!r}")
    if lds == 1:
        raise OptionError("the LDS is a correlation: it needs at least 2 ablations")
    count = scores.shape[0]
    generator = torch.Generator().manual_seed(check_seed(seed))
    ks = [k for k in TOP_K if k < count]
    ordered = scores.detach().cpu().double()
    ranked = ordered.argsort(descending=True, stable=True)
    full = torch.ones(1, count, dtype=torch.bool)
    top = torch.ones(len(ks), count, dtype=torch.bool)
    exact = [math.comb(count, k) <= draws for k in ks]  # every k-set, each once
    blocks = []  # per k, the spans each random (or enumerated) set removes
    for row, k in enumerate(ks):
        top[row, ranked[:k]] = False
        if exact[row]:
            blocks.append(torch.combinations(torch.arange(count), k))
        else:
            blocks.append(torch.rand(draws, count, generator=generator).argsort(dim=1)[:, :k])
    chance = torch.ones(sum(b.shape[0] for b in blocks), count, dtype=torch.bool)
    offsets = [0]
    for removed in blocks:
        start = offsets[-1]
        chance[start : start + removed.shape[0]].scatter_(1, removed, False)
        offsets.append(start + removed.shape[0])
    halves = torch.rand(lds, count, generator=generator) < 0.5
    keep = torch.cat([full, top, chance, halves])
    values = targets(keep).double().cpu()
    whole = values[0]
    dropped = whole - values
    random_drops = dropped[1 + len(ks) : 1 + len(ks) + offsets[-1]]
    drops = []
    for row, k in enumerate(ks):
        random = random_drops[offsets[row] : offsets[row + 1]]
        drops.append(
            TopKDrop(
                k,
                float(dropped[1 + row]),
                float(random.mean()),
                float(random.std(correction=0 if exact[row] else 1)),
                sets=random.shape[0],
                exact=exact[row],
                tied=bool(ordered[ranked[k - 1]] == ordered[ranked[k]]),
            )
        )
    lds_value = None
    if lds:
        predicted = halves.double() @ scores.detach().cpu().double()
        lds_value = spearman(predicted, values[-lds:])
    return Check(
        target=target,
        full=float(whole),
        drops=tuple(drops),
        draws=draws,
        lds=lds_value,
        lds_ablations=lds,
        seed=seed,
        ablation=ablation,
    )
