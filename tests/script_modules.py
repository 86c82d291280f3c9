"""The project's scripts (scripts/*.py) imported as modules by their tests."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@contextlib.contextmanager
def script_module(name: str) -> Iterator[ModuleType]:
    """scripts/`name`.py as a module, with scripts/ on sys.path for its imports of other
    scripts (bench_cite imports bench). Afterwards sys.path is as it was and every module
    imported from scripts/ meanwhile is out of sys.modules again, so that no other test
    sees a script's module state (its caches, its patched globals)."""
    loaded = set(sys.modules)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(SCRIPTS))
        try:
            yield importlib.import_module(name)
        finally:
            for added in set(sys.modules) - loaded:
                origin = getattr(sys.modules[added], "__file__", None)
                if origin is not None and Path(origin).parent == SCRIPTS:
                    del sys.modules[added]
