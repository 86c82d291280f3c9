"""Bridges to the libraries people explain transformers with (docs/bridges.md).

- `explain.bridges.captum_results`: a generation's explanation as captum's
  `LLMAttributionResult` (`GenerationExplanation.to_captum`).

Each library is an optional extra, imported only when its bridge is used: `import explain`
imports none of them.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from explain.errors import ExplainError

__all__ = ["require"]


def require(module: str, extra: str) -> ModuleType:
    """`module` imported, or one ExplainError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ExplainError(
            f"this needs {module.partition('.')[0]} ({error.name} is missing): "
            f"pip install 'explain-transformers[{extra}]'"
        ) from None
