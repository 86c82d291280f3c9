"""The LRP walk of a model family, as the engine uses it (explain.engine runs the LRP
methods: a recorded forward pass, the gradients a method needs, and the walk from each
sample's target logit).

The recorder captures the activations the family's walk names (it is the only code that
hooks the model); the walk then propagates relevance through them with the method's
rule set. An adapter declares its walk (`Adapter.lrp_walk`); `tape_for` builds it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from torch import Tensor, nn

from explain.architectures.base import Adapter
from explain.errors import UnsupportedModelError
from explain.layout import ModuleHook
from explain.lrp.rules import RuleSet

__all__ = ["Tape", "tape_for"]


class Tape(Protocol):
    """A model family's LRP walk: the activations it needs and the propagation over them."""

    hooks: Sequence[tuple[nn.Module, ModuleHook]]
    in_input_space: bool
    """Whether `propagate(..., to_input=True)` returns relevance on the input itself (a
    ViT's pixels) rather than per token (which the adapter then maps)."""

    def propagate(
        self,
        classes: Tensor,
        rules: RuleSet,
        on_attention: Callable[[int, Tensor], None],
        *,
        stop_layer: int = 0,
        to_input: bool = False,
        to_tokens: bool = False,
    ) -> Tensor | None:
        """Relevance from each sample's class logit down to block `stop_layer`, all
        samples at once, handing every block's attention relevance to `on_attention`;
        returns the relevance of the model's input with `to_input`, of block
        `stop_layer`'s input tokens with `to_tokens`, and otherwise None: the walk then
        ends as soon as block `stop_layer`'s attention relevance is delivered."""


def tape_for(adapter: Adapter, *, to_input: bool) -> Tape:
    """The LRP walk the adapter declares, or UnsupportedModelError when it has none."""
    if adapter.lrp_walk is None:
        raise UnsupportedModelError(
            f"the LRP methods have no relevance rules for {adapter.family}; they cover timm "
            "VisionTransformer models and Hugging Face BertForSequenceClassification (use "
            "'generic' for this model)"
        )
    return adapter.lrp_walk.load()(adapter, to_input=to_input)
