"""Architecture adapters: the contract (`base`), the import-free registry (`registry`) and
one small file per model family, imported only when a model is matched against it."""

from __future__ import annotations

from explain.architectures.base import Adapter
from explain.architectures.registry import (
    ADAPTERS,
    FAMILIES,
    adapter_for,
    register_adapter,
    register_family,
    supported_families,
)
from explain.layout import AttentionSite, FlagSetting, Prepared, TokenLayout, TokenSet

__all__ = [
    "ADAPTERS",
    "FAMILIES",
    "Adapter",
    "AttentionSite",
    "FlagSetting",
    "Prepared",
    "TokenLayout",
    "TokenSet",
    "adapter_for",
    "register_adapter",
    "register_family",
    "supported_families",
]
