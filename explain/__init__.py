"""explain: why a transformer made its prediction.

Gradient-weighted attention relevance (Chefer, Gur & Wolf, CVPR 2021 and ICCV 2021) and
its baselines, on the timm and Hugging Face models people already have.

>>> from explain import Explainer
>>> result = Explainer(model).explain(images, method="generic")   # doctest: +SKIP
>>> result.heatmap().shape                                         # doctest: +SKIP
torch.Size([8, 224, 224])
"""

# ruff: noqa: E402  (the filter goes in before transformers and torchao are imported)
from explain import quiet_imports

quiet_imports.install()

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from explain.api import Explainer, explain
    from explain.architectures import supported_families
    from explain.architectures.custom import TransformerSpec
    from explain.engine.targets import Contrast
    from explain.errors import (
        ExplainError,
        InputError,
        ModelLoadError,
        NestedExplanationError,
        OptionError,
        TargetError,
        UnknownMethodError,
        UnsupportedModelError,
    )
    from explain.explanation import Explanation, Trace
    from explain.rules import METHODS, register_method

_PUBLIC = {
    "METHODS": "explain.rules",
    "Contrast": "explain.engine.targets",
    "ExplainError": "explain.errors",
    "Explainer": "explain.api",
    "Explanation": "explain.explanation",
    "InputError": "explain.errors",
    "ModelLoadError": "explain.errors",
    "NestedExplanationError": "explain.errors",
    "OptionError": "explain.errors",
    "TargetError": "explain.errors",
    "Trace": "explain.explanation",
    "TransformerSpec": "explain.architectures.custom",
    "UnknownMethodError": "explain.errors",
    "UnsupportedModelError": "explain.errors",
    "explain": "explain.api",
    "register_method": "explain.rules",
    "supported_families": "explain.architectures",
}
"""Each public name -> the module that defines it, imported at the name's first use:
`import explain` imports no torch, so the console script (explain.console) has its
Ctrl-C guard in place before the seconds the CLI's imports take."""

__all__ = [
    "METHODS",
    "Contrast",
    "ExplainError",
    "Explainer",
    "Explanation",
    "InputError",
    "ModelLoadError",
    "NestedExplanationError",
    "OptionError",
    "TargetError",
    "Trace",
    "TransformerSpec",
    "UnknownMethodError",
    "UnsupportedModelError",
    "__version__",
    "explain",
    "register_method",
    "supported_families",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'explain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # imported once: later uses are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
