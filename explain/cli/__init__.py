"""The `explain` command line: one module per subcommand, each with `register(commands)`."""

from __future__ import annotations

import argparse
import difflib
import functools
import os
import sys
from collections.abc import Sequence

from explain import __version__
from explain.cli import (
    cite,
    clip,
    detect,
    evaluate,
    generate,
    image,
    methods,
    models,
    seq2seq,
    serve,
    text,
)
from explain.cli.options import HelpFormatter
from explain.errors import ExplainError
from explain.export import check_writable
from explain.viz.text import printable

__all__ = ["INTERRUPTED", "build_parser", "check_outputs", "main"]

INTERRUPTED = "explain: interrupted"
"""What a Ctrl-C prints (with exit status 130, 128 + SIGINT, as a shell's); explain.console
prints the same when it comes during the CLI's import."""

OUTPUTS = {
    "out": ("--out", True),
    "html": ("--html", False),
    "png": ("--png", False),
    "output": ("--output", False),
}
"""The output options of the subcommands: argument name -> (option, whether a folder)."""


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse output destinations that cannot be written, before any work (explain.export):
    the output options, then every file a command can name from its arguments alone
    (its `planned` outputs: --save files, figures next to a page, a results' table...)."""
    for name, (option, folder) in OUTPUTS.items():
        path = getattr(args, name, None)
        if path is not None:
            check_writable(path, folder=folder, option=option)
    for planned in getattr(args, "planned", lambda _: [])(args):
        check_writable(planned.path, folder=planned.folder, option=planned.option)


HINT = (
    "Start with `explain models` (the zoo, the model families and the methods each takes), "
    "then `explain COMMAND --help`; the README walks through each command."
)
"""What `explain` alone and `explain --help` say after the commands."""

# Subcommand modules, in the order `explain --help` lists them.
COMMANDS = [cite, clip, detect, evaluate, generate, image, methods, models, seq2seq, serve, text]


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (every subcommand registered)."""
    parser = argparse.ArgumentParser(
        prog="explain",
        description="Why a transformer made its prediction.",
        epilog=HINT,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"explain {__version__}")
    commands = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        # every command's help is wrapped at spaces only (a command may still lay out its
        # description by hand with its own formatter_class)
        parser_class=functools.partial(argparse.ArgumentParser, formatter_class=HelpFormatter),
    )
    for command in COMMANDS:
        command.register(commands)
    return parser


def unrecognized(
    parser: argparse.ArgumentParser, args: argparse.Namespace, unknown: list[str]
) -> str:
    """argparse's "unrecognized arguments" message, with the close options of the command
    (`args.command`) for each unknown flag ("did you mean"; argparse's own suggest_on_error
    is Python 3.14+), and the comma-separated form for methods given apart."""
    subparsers = next(
        action for action in parser._actions if isinstance(action, argparse._SubParsersAction)
    )
    options = sorted(subparsers.choices[args.command]._option_string_actions)
    from explain.rules import METHODS

    hints = []
    for argument in unknown:
        flag = argument.split("=", 1)[0]
        close = difflib.get_close_matches(flag, options, n=3) if flag.startswith("-") else []
        if close:
            hints.append(f"{flag}: did you mean {', '.join(close)}?")
    names = [argument for argument in unknown if argument in METHODS]
    # `--method a b`: argparse took only the first (with no --method, as in `--metod a`,
    # the names are a mistyped flag's values, which the flag's hint covers)
    if names and "--method" in options and args.method is not None:
        together = ",".join([args.method, *names])
        hints.append(f"several methods are one argument, comma-separated: --method {together}")
    message = f"unrecognized arguments: {' '.join(unknown)}"
    return f"{message} ({'; '.join(hints)})" if hints else message


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `explain` console script; returns the exit status.

    Errors that `explain` raises on purpose are printed as one line and exit with 2. Under
    torchrun every process checks the same arguments, so only rank 0 prints the error:
    one line, not one per process.
    """
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):  # the commands, not just "required"
        parser.print_help(sys.stderr)
        return 2
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(unrecognized(parser, args, unknown))
    try:
        check_outputs(args)  # before any model is loaded or anything computed
        return args.run(args)
    except ExplainError as error:
        if os.environ.get("RANK", "0") == "0":  # user text in it is shown, never obeyed
            print(f"explain: error: {printable(str(error))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return 130
