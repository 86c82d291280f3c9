"""The --method and --start-layer options that `explain image` and `explain text` share,
read the same way by both: `all` or comma-separated names, and a start layer that the
methods reading one fixed block ignore with a note (one flag serves several methods)."""

from __future__ import annotations

import sys

__all__ = ["parse_methods", "start_layer_for"]


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
