"""A TransformerLens `TransformerBridge` (TransformerLens 4,
`TransformerBridge.boot_transformers(name, hf_model=...)`) is explained as the Hugging
Face model it wraps.

The bridge puts its components where the Hugging Face model's modules were (a block
bridge for each decoder layer, an attention bridge for its attention, ...), each holding
the module it replaced (its public `original_component`), with TransformerLens's hook
points and hooks inside them. `hugging_face_view` gives the model as Hugging Face built
it: a copy of the module tree whose containers are shallow copies with tables of their
own (children, parameters, buffers, hooks) and whose bridge components are replaced by
the modules they hold. Every parameter, buffer and original module is the bridged
model's own, so nothing is copied; none of the bridge's components, hook points or hooks
runs, and none is touched.

A bridge around anything but a Hugging Face model is refused: TransformerLens 4's native
models (`TransformerBridge.boot_native(TransformerBridgeConfig(...))`, and the legacy
checkpoints `boot_tl_legacy` loads into one; `HookedTransformer` is gone since 4.0) are
modules of TransformerLens's own, of no family `explain` has an adapter for, whose
attention hands its probabilities only to the bridge's `hook_pattern` callback.

A bridge in compatibility mode (`enable_compatibility_mode()`) has processed the
weights: for a Llama it centres the unembedding in place, so the view computes what the
bridge computes, logits shifted by their mean over the vocabulary.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from explain.errors import UnsupportedModelError

__all__ = ["hugging_face_view", "is_bridge"]

_COMPONENT = ("transformer_lens.model_bridge.generalized_components.base", "GeneralizedComponent")
_BRIDGE = ("transformer_lens.model_bridge.bridge_core", "BridgeCore")
_HUGGING_FACE_MODEL = ("transformers.modeling_utils", "PreTrainedModel")


def _is_class(obj: object, module: str, name: str) -> bool:
    """Whether `obj` is an instance of class `name` of `module` (or of a subclass), without
    importing that module."""
    return any(cls.__module__ == module and cls.__name__ == name for cls in type(obj).__mro__)


def is_bridge(obj: object) -> bool:
    """Whether `obj` is a TransformerLens bridge (a `TransformerBridge`)."""
    return _is_class(obj, *_BRIDGE)


def hugging_face_view(bridge: Any) -> nn.Module:
    """The Hugging Face model `bridge` wraps, as Hugging Face built it (see the module
    doc); the bridge and the model it holds are left as they are. Refused
    (`UnsupportedModelError`) where the bridge wraps a model that is not Hugging Face's."""
    wrapped = bridge.original_model
    if not _is_class(wrapped, *_HUGGING_FACE_MODEL):
        kind = type(wrapped)
        raise UnsupportedModelError(
            f"this TransformerBridge wraps a {kind.__module__}.{kind.__qualname__}, not a "
            "Hugging Face model: TransformerLens's native models (boot_native, "
            "boot_tl_legacy) are of no family explain has an adapter for, and their "
            "attention hands its probabilities only to the bridge's hook_pattern. Build the "
            "model with transformers from a config instead (e.g. "
            "LlamaForCausalLM(LlamaConfig(...)), saved with save_pretrained(folder)) and boot "
            "it with TransformerBridge.boot_transformers(folder, hf_model=model), which is "
            "explained exactly (docs/bridges.md)"
        )
    return _restored(wrapped)


def _holds_component(module: nn.Module) -> bool:
    return any(_is_class(m, *_COMPONENT) for m in module.modules())


def _restored(module: nn.Module) -> nn.Module:
    """`module` with every bridge component below it replaced by the module it holds:
    `module` itself where it holds none, else a shallow copy with tables of its own."""
    while _is_class(module, *_COMPONENT):
        module = module.original_component
    if not _holds_component(module):
        return module
    view = copy.copy(module)
    for name, value in vars(module).items():
        # every table (children, parameters, buffers, hook dictionaries) is the copy's
        # own: a hook an explanation registers on the copy never reaches the original
        if isinstance(value, dict):
            view.__dict__[name] = type(value)(value)
    view._modules = {
        name: None if child is None else _restored(child) for name, child in module._modules.items()
    }
    return view
