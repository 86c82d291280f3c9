"""The terminal's view of a generated answer: a line saying how to read them, then one
line per generated token with the tokens it rests on most, their positions and signed
values (explain.viz.ranking: by |relevance|, the readout token left out), as the page's
status line and the figure's numbered cells give them."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from explain.viz.ranking import sources_text

__all__ = ["print_rests_on"]

HOW_TO_READ = (
    "  what each generated token rests on most, by |relevance| (the token it is read out "
    "at left out): 'token'@position value"
)
"""The line above the tokens' lines: positions count the shown tokens from 0."""


def print_rests_on(
    generated: Sequence[str],
    tokens: Sequence[str],
    relevance: Tensor,
    rests_on: Sequence[Sequence[int]],
) -> None:
    """`'token' <- 'a'@3 0.41, 'b'@0 -0.2` for each generated token g: the `tokens` at
    the positions `rests_on[g]` (explain.viz.ranking.rests_on), with their relevance in
    row g of `relevance` (G, len(tokens)), most relevant first."""
    print(HOW_TO_READ)
    for g, token in enumerate(generated):
        print(f"  {token!r:>16} <- {sources_text(tokens, relevance[g], rests_on[g])}")
