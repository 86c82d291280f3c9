"""`--method`, read the same way by every command: `all` or comma-separated names, each
checked before any model is loaded (none: the model kind's default method,
explain.defaults), then narrowed to the methods the loaded model takes
(`methods_the_model_takes`); and the --target, --score and --start-layer options that
`explain image` and `explain text` share, a score and a start layer each going only to the
methods that take them, with a note for the others (one flag serves several methods; in
Python such a method refuses the argument)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from explain.defaults import in_words

__all__ = [
    "ALL",
    "DEFAULT_HELP",
    "add_method_arguments",
    "add_method_option",
    "method_file",
    "methods_the_model_takes",
    "named_methods",
    "parse_methods",
    "score_for",
    "start_layer_for",
]


DEFAULT_HELP = (
    f"default: the model kind's method, {in_words()}; `explain methods --model M` shows it and why"
)
"""What every command's --method help says of the default, from explain.defaults' table."""

ALL = "all"
"""The `--method` value that means every method the model takes."""


def add_method_option(
    parser: argparse.ArgumentParser, default: str | None = None, *aliases: str
) -> None:
    """`--method M[,M2]` (or `all`; `aliases`: other spellings of the option); `default`
    None: the model kind's default method."""
    shown = DEFAULT_HELP if default is None else f"default: {default}"
    parser.add_argument(
        "--method",
        *aliases,
        dest="method",
        default=default,
        metavar="M[,M2]",
        help="comma-separated method names, or `all`: every method the model takes "
        f"(`explain models` lists them); {shown}",
    )


def add_method_arguments(parser: argparse.ArgumentParser, **target: Any) -> None:
    """--method, --target (whose meaning is the command's: `target` holds its
    add_argument keywords), --score and --start-layer."""
    add_method_option(parser)
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
    text: str | None,
    adapter: Any,
    model: str,
    generation: bool = False,
    option: str = "--method",
) -> list[str]:
    """The methods of `--method` (`text`, read by `parse_methods`) to run on `model` (its
    `adapter`), in calls of the command's kind (`generation`: answers a language model
    writes, which some methods cannot explain). None: the default of the model's kind
    (explain.defaults). `all` means every method the model takes: the others are left out
    with a note on stderr that names them and why (explain.engine.refusals). Methods named
    one by one must all be taken: any that is not is refused before anything is computed,
    with the methods the model takes (explain.engine.require_methods)."""
    from explain.defaults import default_method
    from explain.engine import Request, refusals, require_methods

    if text is None:
        return [default_method(adapter).method]
    methods = parse_methods(text, option)
    request = Request(prompt_length=1) if generation else None
    if text.strip() != ALL:
        require_methods(adapter, methods, model, request)
        return methods
    refused = refusals(adapter, request)
    reasons: dict[str, list[str]] = {}
    for name in methods:
        if name in refused:
            reasons.setdefault(refused[name], []).append(name)
    for reason, names in reasons.items():
        print(
            f"explain: note: {option} all: {model} does not take {', '.join(names)} ({reason})",
            file=sys.stderr,
        )
    return [name for name in methods if name not in refused]


def method_file(path: Path, method: str | None, text: str | None) -> Path:
    """Where the output `path` of `method` goes when `--method` is `text`: `path` itself
    when `text` names one method or none (the default), else `path` with `_METHOD` before
    its suffix (cite.html -> cite_attnlrp.html; `all` included), so that several methods
    never overwrite each other's files and the names are known from the arguments alone."""
    if text is None or (text.strip() != ALL and len(parse_methods(text)) == 1):
        return path
    return path.with_name(f"{path.stem}_{method}{path.suffix}")


def named_methods(text: str | None) -> list[str | None]:
    """The methods `--method` names, for the outputs planned before the model is loaded:
    None alone for the default (one method, whose files carry no name)."""
    return [*parse_methods(text)] or [None]


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
