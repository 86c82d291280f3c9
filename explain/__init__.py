"""explain: why a transformer made its prediction.

Gradient-weighted attention relevance (Chefer, Gur & Wolf, CVPR 2021 and ICCV 2021) and
its baselines, on the timm and Hugging Face models people already have.

>>> from explain import Explainer
>>> result = Explainer(model).explain(images, method="generic")   # doctest: +SKIP
>>> result.heatmap().shape                                         # doctest: +SKIP
torch.Size([8, 224, 224])
"""

import functools
import importlib
import sys
import warnings
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec, PathFinder, SourceFileLoader
from types import ModuleType
from typing import Any

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


# -- paths that moved (deprecated for one release; docs/architecture.md) -----------------

_MOVED: dict[str, tuple[str, ...]] = {
    "explain.fused": ("explain.engine.fused",),
    "explain.hub": ("explain.loading.hub",),
    "explain.image_prompts": ("explain.inputs", "explain.loading.preprocessing"),
    "explain.io": ("explain.export", "explain.loading.preprocessing"),
    "explain.loaded_model": ("explain.loading.loaded_model",),
    "explain.lrp.rules": ("explain.lrp.propagation",),
    "explain.preprocessing": ("explain.loading.preprocessing", "explain.inputs"),
    "explain.rules.windowed": ("explain.rules.fold",),
    "explain.targets": ("explain.engine.targets",),
    "explain.tokenizing": ("explain.inputs",),
    "explain.zoo": ("explain.loading.zoo",),
}
"""A module that moved -> the modules that now hold its names, searched in order."""

_RENAMED: dict[str, dict[str, str]] = {
    "explain.architectures.hf_bert": {"HuggingFaceTextEncoder": "HFTextEncoder"},
    "explain.architectures.hf_causal_lm": {"HuggingFaceCausalLM": "HFCausalLM"},
    "explain.architectures.hf_common": {"HuggingFaceAdapter": "HFAdapter"},
    "explain.architectures.hf_detr": {"HuggingFaceDetr": "HFDetr"},
    "explain.architectures.hf_swin": {"HuggingFaceSwin": "HFSwin"},
    "explain.architectures.hf_vision": {
        "HuggingFaceBeit": "HFBeit",
        "HuggingFaceDinov2": "HFDinov2",
        "HuggingFaceImageClassifier": "HFImageClassifier",
        "HuggingFaceSiglipClassifier": "HFSiglipClassifier",
    },
    "explain.architectures.hf_vit": {"HuggingFaceViT": "HFViT"},
}
"""A module -> its renamed classes, old name -> new name (one prefix, HF, for the Hugging
Face adapters)."""


def _moved_name(module: str, name: str) -> Any:
    """`module.name` for a module that moved: found in its new home (the first that lists
    it in `__all__`, else the first that has it), with a warning that says where."""
    homes = [importlib.import_module(home) for home in _MOVED[module]]
    listed = [home for home in homes if name in getattr(home, "__all__", ())]
    for found in listed or homes:
        home = found.__name__
        if hasattr(found, name):
            warnings.warn(
                f"{module} moved: import {name} from {home}; the old path goes in the next release",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(found, name)
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


def _renamed_name(module: str, name: str) -> Any:
    """`module.name` for a class that was renamed, with a warning that names it now."""
    new = _RENAMED[module].get(name)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(
        f"{module}.{name} is now {new}; the old name goes in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(sys.modules[module], new)


class _MovedLoader(Loader):
    """Makes a moved module an empty module whose names come from `_moved_name`."""

    def create_module(self, spec: ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.__getattr__ = functools.partial(_moved_name, module.__name__)


class _RenamingLoader(SourceFileLoader):
    """Loads a module as Python does, then answers its renamed classes' old names."""

    def exec_module(self, module: ModuleType) -> None:
        super().exec_module(module)
        module.__getattr__ = functools.partial(_renamed_name, module.__name__)


class _OldPaths(MetaPathFinder):
    """Finds the moved modules (`_MOVED`) and the modules with renamed classes
    (`_RENAMED`); every other import goes its usual way."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if name in _MOVED:
            return ModuleSpec(name, _MovedLoader())
        if name in _RENAMED:
            spec = PathFinder.find_spec(name, path)
            if spec is not None and isinstance(spec.loader, SourceFileLoader):
                spec.loader = _RenamingLoader(spec.loader.name, spec.loader.path)
            return spec
        return None


def _install_old_paths() -> None:
    """Put the finder first on the import path, once, and answer the renamed classes of
    the modules imported above, before it was there."""
    if any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
        return
    sys.meta_path.insert(0, _OldPaths())
    for name in _RENAMED.keys() & sys.modules.keys():
        sys.modules[name].__getattr__ = functools.partial(_renamed_name, name)


_install_old_paths()
