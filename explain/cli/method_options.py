"""The --method, --target, --score and --start-layer options that `explain image` and
`explain text` share, read the same way by both: `all` or comma-separated names (none:
the model kind's default method, explain.defaults), and a score and a start layer that
each go only to the methods that take them, with a note for the others (one flag serves
several methods; in Python such a method refuses the argument)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from explain.defaults import in_words

__all__ = [
    "DEFAULT_HELP",
    "add_method_arguments",
    "methods_the_model_takes",
    "parse_methods",
    "score_for",
    "start_layer_for",
]


DEFAULT_HELP = (
    f"default: the model kind's method, {in_words()}; `explain methods --model M` shows it and why"
)
"""What every command's --method help says of the default, from explain.defaults' table."""


def add_method_arguments(parser: argparse.ArgumentParser, **target: Any) -> None:
    """--method, --target (whose meaning is the command's: `target` holds its
    add_argument keywords), --score and --start-layer."""
    parser.add_argument(
        "--method",
        metavar="M[,M2]",
        help="comma-separated method names, or `all` (`explain models` lists them); "
        + DEFAULT_HELP,
    )
    parser.add_argument("--target", **target)
    parser.add_argument(
        "--score",
        choices=("logit", "probability", "log_probability"),
        help="what the methods that differentiate a score differentiate for the explained "
        "class; the others ignore it, with a note; default: logit",
    )
    parser.add_argument(
        "--start-layer",
        type=int,
        metavar="L",
        help="first block the aggregating methods use (negative: from the end); methods "
        "that read one fixed block ignore it, with a note; default: each method's own",
    )


def parse_methods(text: str | None, option: str = "--method") -> list[str]:
    """`--method` (or `option`): `all` (every registered method) or comma-separated names,
    each checked before any model is loaded; a name given twice is explained once, and an
    empty entry (`generic,`, `,`) is refused rather than read as "every method". None (no
    --method): no names, since the model's default is known once it is loaded
    (`methods_the_model_takes` names it)."""
    from explain.errors import OptionError
    from explain.rules import METHODS, get_method

    if text is None:
        return []
    if text.strip() == "all":
        return sorted(METHODS)
    names = [part.strip() for part in text.split(",")]
    if not all(names):
        raise OptionError(f"empty entry in {option} {text!r}: give method names, or `all`")
    for name in names:
        get_method(name)  # unknown names fail before the model is loaded
    return list(dict.fromkeys(names))


def methods_the_model_takes(
    text: str | None, methods: list[str], adapter: Any, model: str
) -> list[str]:
    """The methods of `--method` (`text`, read into `methods` by `parse_methods`) to run
    on `model` (its `adapter`). None: the default of the model's kind (explain.defaults).
    `all` means every method the model takes: the others are left out with a note on
    stderr that names them and why (explain.engine.refusals). Methods named one by one
    are all run: one the model does not take is refused by the engine, naming those it
    takes, before anything is written."""
    from explain.defaults import default_method
    from explain.engine import refusals

    if text is None:
        return [default_method(adapter).method]
    if text.strip() != "all":
        return methods
    refused = refusals(adapter)
    reasons: dict[str, list[str]] = {}
    for name in methods:
        if name in refused:
            reasons.setdefault(refused[name], []).append(name)
    for reason, names in reasons.items():
        print(
            f"explain: note: --method all: {model} does not take {', '.join(names)} ({reason})",
            file=sys.stderr,
        )
    return [name for name in methods if name not in refused]


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
    """`--score` for `method`: as given for the methods that take a score (those that
    differentiate it, and occlusion); None, with a note on stderr, for the others
    (explain.engine.resolve_score)."""
    from explain.rules import get_method

    if score is None or get_method(method).takes_score:
        return score
    print(
        f"explain: note: {method} differentiates no score; --score is ignored for it",
        file=sys.stderr,
    )
    return None
