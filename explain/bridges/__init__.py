"""Bridges to the libraries people explain transformers with (docs/bridges.md).

- `explain.bridges.captum_results`: a generation's explanation as captum's
  `LLMAttributionResult` (`GenerationExplanation.to_captum`).
- `explain.bridges.inseq_results`: generations' explanations as inseq's
  `FeatureAttributionOutput` (`GenerationExplanation.to_inseq`).

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
        package = module.partition(".")[0]
        # the library itself, or a dependency of it that its install left out
        missing = package if (error.name or package).startswith(package) else error.name
        raise ExplainError(
            f"this needs {package} ({missing} is missing): "
            f"pip install 'explain-transformers[{extra}]'"
        ) from None
