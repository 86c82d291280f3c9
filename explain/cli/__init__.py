"""The `explain` command line: one module per subcommand, each with `register(commands)`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from explain.cli import clip, evaluate, generate, image, models, seq2seq, text
from explain.errors import ExplainError

__all__ = ["build_parser", "main"]

# Subcommand modules, in the order `explain --help` lists them.
COMMANDS = [clip, evaluate, generate, image, models, seq2seq, text]


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (every subcommand registered)."""
    parser = argparse.ArgumentParser(
        prog="explain", description="Why a transformer made its prediction."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `explain` console script; returns the exit status.

    Errors that `explain` raises on purpose are printed as one line and exit with 2.
    """
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ExplainError as error:
        print(f"explain: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("explain: interrupted", file=sys.stderr)
        return 130
