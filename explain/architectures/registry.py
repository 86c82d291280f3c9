"""The registry of model families: which adapter explains which model.

Like timm's `_registry`, it imports no family: each entry names its adapter's module and
class, and the module is imported only when a model is matched against it (or the
family's name is asked for). The family modules import nothing from here, so the module
graph has no loop. A new family is:

1. one file in explain/architectures/ holding everything family-specific: an `Adapter`
   subclass, or a subclass of its kind's contract (base.py: the abstract members, plus
   any capability it declares: `fused_path()`, `pooled_by_mean`, and the optional
   methods `lrp_walk` and `attnlrp_sites`, whose walk and sites live in the same file);
2. one `register_family(name, module, class)` line below;
3. one entry `name: builder` in explain.testing.TINY_MODELS (a tiny model from a config
   and two inputs), which tests/test_conformance.py runs every contract on.

Adapters defined elsewhere (a user's own model) register at run time with the
`register_adapter` class decorator and are matched first.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from torch import nn

from explain.architectures.base import Adapter
from explain.architectures.scope import unsupported_model_message
from explain.architectures.wrappers import refuse_quantised_activations, unwrap
from explain.errors import UnsupportedModelError

__all__ = [
    "ADAPTERS",
    "FAMILIES",
    "Family",
    "adapter_classes",
    "adapter_for",
    "register_adapter",
    "register_family",
    "supported_families",
]


@dataclass(frozen=True)
class Family:
    """A registered model family: its name (the key of its tiny model in
    explain.testing) and where its adapter class lives."""

    name: str
    module: str
    adapter: str

    def load(self) -> type[Adapter]:
        """The adapter class (importing its module on first use)."""
        return getattr(importlib.import_module(self.module), self.adapter)


FAMILIES: dict[str, Family] = {}
"""The built-in families by name, in registration order (the order `explain models` lists)."""

ADAPTERS: list[type[Adapter]] = []
"""Adapter classes registered at run time with `register_adapter`, most recent first."""


def register_family(name: str, module: str, adapter: str) -> Family:
    """Register the family `name`, served by class `adapter` of module `module`."""
    family = FAMILIES[name] = Family(name, module, adapter)
    return family


def register_adapter(cls: type[Adapter]) -> type[Adapter]:
    """Class decorator for adapters defined outside the registry (e.g. for a user's own
    model): `adapter_for` considers them before the built-in families, most recent first."""
    if cls in ADAPTERS:
        ADAPTERS.remove(cls)
    ADAPTERS.insert(0, cls)
    return cls


def adapter_classes() -> list[type[Adapter]]:
    """Every adapter class in the order `adapter_for` tries them: run-time registrations
    (most recent first), then the built-in families (last registered first)."""
    built_in = [family.load() for family in reversed(FAMILIES.values())]
    return [*ADAPTERS, *(cls for cls in built_in if cls not in ADAPTERS)]


def supported_families() -> list[str]:
    """Names of the model families `explain` can instrument."""
    return [cls.family for cls in reversed(adapter_classes())]


def adapter_for(model: nn.Module) -> Adapter:
    """The adapter for `model`, or UnsupportedModelError naming the supported families."""
    if not isinstance(model, nn.Module):
        raise UnsupportedModelError(
            f"expected a torch.nn.Module, got {type(model).__name__}; supported families: "
            + "; ".join(supported_families())
        )
    model = unwrap(model)  # DataParallel, DistributedDataParallel, torch.compile, PEFT
    refuse_quantised_activations(model)
    for cls in adapter_classes():
        if cls.matches(model):
            return cls(model)
    raise UnsupportedModelError(unsupported_model_message(model, supported_families()))


register_family("timm_vit", "explain.architectures.timm_vit", "TimmVisionTransformer")
register_family("hf_text_encoder", "explain.architectures.hf_bert", "HFTextEncoder")
register_family("hf_clip", "explain.architectures.hf_clip", "HFClip")
register_family("hf_causal_lm", "explain.architectures.hf_causal_lm", "HFCausalLM")
register_family("hf_encoder_decoder", "explain.architectures.hf_seq2seq", "HFEncoderDecoder")
register_family("hf_vit", "explain.architectures.hf_vit", "HFViT")
register_family("open_clip", "explain.architectures.open_clip", "OpenClip")
register_family("timm_eva", "explain.architectures.timm_eva", "TimmEva")
register_family("timm_beit", "explain.architectures.timm_beit", "TimmBeit")
register_family("hf_dinov2", "explain.architectures.hf_vision", "HFDinov2")
register_family("hf_beit", "explain.architectures.hf_vision", "HFBeit")
register_family("hf_siglip_classifier", "explain.architectures.hf_vision", "HFSiglipClassifier")
register_family("hf_siglip", "explain.architectures.hf_siglip", "HFSiglip")
register_family("timm_swin", "explain.architectures.timm_swin", "TimmSwin")
register_family("hf_swin", "explain.architectures.hf_swin", "HFSwin")
register_family("hf_detr", "explain.architectures.hf_detr", "HFDetr")
register_family("hf_llava", "explain.architectures.hf_llava", "HFLlava")
register_family("hf_paligemma", "explain.architectures.hf_paligemma", "HFPaliGemma")
register_family("hf_gemma3", "explain.architectures.hf_gemma3", "HFGemma3")
register_family("hf_qwen2_vl", "explain.architectures.hf_qwen2_vl", "HFQwen2VL")
register_family("hf_qwen2_5_vl", "explain.architectures.hf_qwen2_5_vl", "HFQwen2_5VL")
register_family("hf_idefics3", "explain.architectures.hf_idefics3", "HFIdefics3")
register_family("hf_smolvlm", "explain.architectures.hf_smolvlm", "HFSmolVLM")
