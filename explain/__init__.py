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
