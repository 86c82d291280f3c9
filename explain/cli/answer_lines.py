"""The terminal's view of a generated answer: one line per generated token, naming the
tokens it rests on most (explain.generation.rests_on, the readout token left out), as
the page's status line and the figure's rows say."""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["print_rests_on"]


def print_rests_on(
    generated: Sequence[str], tokens: Sequence[str], rests_on: Callable[[int], list[int]]
) -> None:
    """`'token' <- 'a', 'b', 'c'` for each generated token g: the `tokens` at the
    positions `rests_on(g)` gives, most relevant first (repr: control characters and
    spaces stay visible)."""
    for g, token in enumerate(generated):
        sources = ", ".join(repr(tokens[i]) for i in rests_on(g)) or "(nothing read before it)"
        print(f"  {token!r:>16} <- {sources}")
