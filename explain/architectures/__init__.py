"""Registry of architecture adapters: one small file per model family."""

from __future__ import annotations

from torch import nn

from explain.architectures.base import Adapter, AttentionSite, FlagSetting, Prepared, TokenLayout
from explain.errors import UnsupportedModelError

__all__ = [
    "ADAPTERS",
    "Adapter",
    "AttentionSite",
    "FlagSetting",
    "Prepared",
    "TokenLayout",
    "adapter_for",
    "register_adapter",
    "supported_families",
]

ADAPTERS: list[type[Adapter]] = []


def register_adapter(cls: type[Adapter]) -> type[Adapter]:
    """Class decorator: make `adapter_for` consider this family (most recent first)."""
    if cls in ADAPTERS:
        ADAPTERS.remove(cls)
    ADAPTERS.insert(0, cls)
    return cls


def supported_families() -> list[str]:
    """Names of the model families `explain` can instrument."""
    return [cls.family for cls in reversed(ADAPTERS)]


def adapter_for(model: nn.Module) -> Adapter:
    """The adapter for `model`, or UnsupportedModelError naming the supported families."""
    if not isinstance(model, nn.Module):
        raise UnsupportedModelError(
            f"expected a torch.nn.Module, got {type(model).__name__}; supported families: "
            + "; ".join(supported_families())
        )
    for cls in ADAPTERS:
        if cls.matches(model):
            return cls(model)
    raise UnsupportedModelError(
        f"{type(model).__module__}.{type(model).__qualname__} is not a supported model. "
        "Supported families: " + "; ".join(supported_families()) + "."
    )


# Importing the family modules registers them, timm first so that it leads the list.
from explain.architectures import timm_vit  # noqa: E402,F401  isort: skip
from explain.architectures import (  # noqa: E402,F401
    hf_bert,
    hf_causal_lm,
    hf_clip,
    hf_seq2seq,
    hf_vit,
    open_clip,
)
