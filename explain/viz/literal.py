"""Figures draw every string as it is written: class names, prompts, tokens and model
names are the user's text, and matplotlib would read anything between two `$` as math
(and raise on what it cannot parse, e.g. a class named "a $\\x$")."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["literal_text"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def literal_text(build: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run a figure builder with matplotlib's math parsing off: each text object takes
    the setting when it is created, so the figure keeps it when it is drawn later."""

    @functools.wraps(build)
    def without_math(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        import matplotlib

        with matplotlib.rc_context({"text.parse_math": False}):
            return build(*args, **kwargs)

    return without_math
