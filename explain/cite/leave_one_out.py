"""A span ranking refined by a handful of ablations: the spans a one-pass score marks most
strongly, for or against, are each removed alone and scored by what that does.

A one-pass score reads the model at the whole context and is linear in the spans; it can
miss a span the answer needs through the attention weights alone. On a two-hop question
(`?? a` answered c through `a b .` and `b c .`, `zoo:twohop-llama`) the bridge `a b .`
acts through the last block's attention weights only: with the bridge replaced by filler
words and that block's attention weights taken from the intact prompt, the answer comes
back. CP-LRP holds the attention weights constant, so the bridge gets only what flows
through its values, and that is negative (b is not the answer); AttnLRP, which passes
relevance through the softmax, scores it negative too. Either way the bridge ranks last
or near it, with one of the largest magnitudes of any span (docs/benchmarks.md,
"Two-hop span attribution"), and removing it alone takes the answer away.

`leave_one_out` keeps the one-pass ranking but replaces the scores of its `count` spans of
largest |score| (ties: the spans' order) by their leave-one-out drops: the target with
the whole context minus the target without that span, in nats of the target, the unit
the relevance of log p(answer) has for the methods linear in the score (AttnLRP,
CP-LRP), so the other spans keep their scores beside them. Cost: `count` + 1 ablated
forwards in one batch (the whole context's among them), no random draw.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from explain.errors import OptionError

__all__ = ["DEFAULT_COUNT", "candidates", "check_count", "leave_one_out", "removed_alone_note"]

DEFAULT_COUNT = 4
"""The spans `cite` rescores when its call names no count, for a method linear in the
score (its relevance is in the target's nats, as the drops are). Measured at 512 tokens
(docs/benchmarks.md): on the zoo's two-hop model CP-LRP puts both facts of the chain in
its top 2 on 15 of 16 prompts with 4 (8: 15; none: 4); on the one-hop recall model 4
leaves the top span on 12 of 12 and the LDS at 0.768 (none: 0.767). Its 5 forwards cost
a default citation (the check's about 60 ablated forwards included) 3-7% more time."""


def check_count(count: object) -> int:
    """`count` when it is a whole number >= 0 (0: no ablation); OptionError otherwise."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise OptionError(f"ablate is a number of spans to remove one at a time, got {count!r}")
    return count


def candidates(scores: Tensor, count: int) -> Tensor:
    """The indices of the `count` scores (S,) of largest magnitude (every one when `count`
    >= S), largest first; equal magnitudes in the scores' order."""
    magnitude = scores.detach().double().abs().cpu()
    return magnitude.argsort(descending=True, stable=True)[: min(count, scores.shape[0])]


def leave_one_out(
    scores: Tensor,
    targets: Callable[[Tensor], Tensor],
    count: int,
    chosen_by: Tensor | None = None,
) -> tuple[Tensor, tuple[int, ...]]:
    """`scores` (S,) with those of the `count` candidates (`candidates` of `chosen_by`,
    default `scores`) replaced by their leave-one-out drops, in float64; and the
    candidates' indices, largest first (what a reader must be told: their scores are
    drops, `removed_alone_note`).

    `targets` maps ablations `keep` (M, S) (span s kept in ablation m; row 0 keeps every
    span) to the target under each, (M,), as explain.cite.check.check_scores takes it;
    it is called once, with `count` + 1 rows (none for `count` 0)."""
    refined = scores.detach().double().cpu().clone()
    chosen = candidates(scores if chosen_by is None else chosen_by, check_count(count))
    if chosen.numel() == 0:
        return refined, ()
    keep = torch.ones(1 + chosen.numel(), scores.shape[0], dtype=torch.bool)
    keep[torch.arange(1, 1 + chosen.numel()), chosen] = False
    values = targets(keep).double().cpu()
    refined[chosen] = values[0] - values[1:]
    return refined, tuple(chosen.tolist())


def removed_alone_note(ablated: Sequence[int], method: str, contrast: bool = False) -> str:
    """What the terminal, the page and the figure say of a citation whose `ablated` spans
    (indices) have leave-one-out drops for their whole-answer scores, where the other
    scores are `method`'s relevance; "" for none. Spans are numbered from 1, as everywhere
    they are shown; `contrast`: the target is log p(answer) - log p(foil)."""
    if not ablated:
        return ""
    numbers = [str(s + 1) for s in ablated]
    named = numbers[0] if len(numbers) == 1 else f"{', '.join(numbers[:-1])} and {numbers[-1]}"
    target = "log p(answer) - log p(foil)" if contrast else "log p(answer)"
    several = len(numbers) > 1
    return (
        f"The whole answer's score{'s' if several else ''} of span{'s' if several else ''} "
        f"{named} (the {len(numbers) if several else 'one'} of largest |score|) "
        f"{'are' if several else 'is a'} leave-one-out drop{'s' if several else ''}: what "
        f"removing that span alone takes from {target}, in nats; any other whole-answer "
        f"score, and every token's and sentence's, is the relevance of {method}."
    )
