"""The --method, --score and --start-layer options that `explain image` and `explain text`
share, read the same way by both: `all` or comma-separated names, and a score and a start
layer that each go only to the methods that take them, with a note for the others (one
flag serves several methods; in Python such a method refuses the argument)."""

from __future__ import annotations

import sys

__all__ = ["SCORES_HELP", "parse_methods", "score_for", "start_layer_for"]

SCORES_HELP = (
    "what the methods that differentiate a score differentiate for the explained class; "
    "the others ignore it, with a note; default: logit"
)


def parse_methods(text: str) -> list[str]:
    """`--method`: `all` (every registered method) or comma-separated names, each checked
    before any model is loaded; a name given twice is explained once."""
    from explain.rules import METHODS, get_method

    if text.strip() == "all":
        return sorted(METHODS)
    names = [part.strip() for part in text.split(",")]
    for name in names:
        get_method(name)  # unknown names fail before the model is loaded
    return list(dict.fromkeys(names))


def start_layer_for(method: str, start_layer: int | None) -> int | None:
    """`--start-layer` for `method`: as given for the methods that aggregate over blocks;
    None, with a note on stderr, for those that read one fixed block."""
    from explain.rules import get_method

    if start_layer is None or get_method(method).default_start_layer is not None:
        return start_layer
    print(
        f"explain: note: {method} reads one fixed block; --start-layer is ignored for it",
        file=sys.stderr,
    )
    return None


def score_for(method: str, score: str | None) -> str | None:
    """`--score` for `method`: as given for the methods that differentiate a score; None,
    with a note on stderr, for those that differentiate none (explain.engine.resolve_score)."""
    from explain.rules import get_method

    if score is None or get_method(method).needs_gradients:
        return score
    print(
        f"explain: note: {method} differentiates no score; --score is ignored for it",
        file=sys.stderr,
    )
    return None
