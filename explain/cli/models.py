"""`explain models`: the supported model families and the registered methods."""

from __future__ import annotations

import argparse

__all__ = ["register"]


def run(args: argparse.Namespace) -> int:
    from explain.architectures import supported_families
    from explain.rules import METHODS

    print("Supported model families:")
    for family in supported_families():
        print(f"  {family}")
    print("Methods:")
    for name in sorted(METHODS):
        print(f"  {name:24s} {METHODS[name].summary}")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "models", help="list supported model families and methods", description=__doc__
    )
    parser.set_defaults(run=run)
