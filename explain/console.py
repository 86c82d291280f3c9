"""The `explain` console script: the command line with a Ctrl-C guard in place before
the CLI is imported.

Importing the CLI takes seconds (torch, then every subcommand's imports). A Ctrl-C
meanwhile raised KeyboardInterrupt out of the import, before `explain.cli.main` and its
own guard existed, and printed a traceback. This module imports nothing heavy (the
`explain` package imports its public names at their first use), so it can end such a
run as `explain.cli.main` ends one interrupted later: one line, exit status 130.
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> int:
    """Entry point of the `explain` console script; returns the exit status."""
    try:
        from explain import cli
    except KeyboardInterrupt:
        print("explain: interrupted", file=sys.stderr)  # cli.INTERRUPTED, not yet imported
        return 130
    return cli.main()
