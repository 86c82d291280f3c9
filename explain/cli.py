"""The `explain` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from explain.errors import ExplainError

__all__ = ["main"]


def _models(args: argparse.Namespace) -> int:
    from explain.architectures import supported_families
    from explain.rules import METHODS

    print("Supported model families:")
    for family in supported_families():
        print(f"  {family}")
    print("Methods:")
    for name in sorted(METHODS):
        print(f"  {name:20s} {METHODS[name].summary}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="explain", description="Why a transformer made its prediction."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    models = commands.add_parser("models", help="list supported model families and methods")
    models.set_defaults(run=_models)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `explain` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ExplainError as error:
        print(f"explain: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
