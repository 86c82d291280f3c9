"""A model family's LRP walk: what it offers the engine (`LrpWalk`), and what every walk
shares: forward hooks that keep activations (`keep`), the start of every walk (relevance 1
at the class logit), and the checks that every module on the propagation path has a rule
(errors name the module type).

A family declares its walk as an adapter method (`Adapter.lrp_walk`, in its own file in
explain.architectures); the recorder captures the activations the walk names (it is the
only code that hooks the model), and the walk then propagates relevance through them
with the method's rule set (explain.lrp.propagation). explain.engine runs the calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from explain.errors import UnsupportedModelError
from explain.layout import ModuleHook
from explain.lrp.propagation import RuleSet, passes_through
from explain.lrp.weights import acts_as

__all__ = [
    "LrpWalk",
    "keep",
    "lacks",
    "logit_relevance",
    "require_forward",
    "require_linear",
    "require_pass",
    "type_name",
]


class LrpWalk(Protocol):
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


def lacks(check: Callable[[], object]) -> str | None:
    """What a walk's `check` of a model (which raises UnsupportedModelError naming the
    first module no rule covers) finds missing, said for an error message; None where it
    finds nothing (`Adapter.lrp_missing`)."""
    try:
        check()
    except UnsupportedModelError as error:
        return str(error)
    return None


def type_name(module: nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def keep(store: dict[str, Tensor], key: str, pick: str = "output") -> ModuleHook:
    """A forward hook that keeps the module's `pick`: "output", "input" (its first
    positional input), "output0"/"output1" (an item of a tuple output), or "mask" (its
    `attention_mask` keyword argument; None is not kept).

    The tensor is kept as the forward made it, not detached: the walk reads it under
    no_grad, so it adds nothing to any graph, and the forward's graph lives exactly as
    long without it (the call holds the scores it hangs from). A detach would cost a
    dispatched op per activation and save nothing.
    """

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        if pick == "input":
            value = args[0]
        elif pick == "mask":
            value = kwargs.get("attention_mask")
            if value is None:
                return
        elif pick.startswith("output") and pick != "output":
            value = out[int(pick[len("output") :])]
        else:
            value = out
        store[key] = value

    return hook


def logit_relevance(logits: Tensor, classes: Tensor, dtype: torch.dtype) -> Tensor:
    """The start of every walk: relevance 1.0 at each sample's class logit, 0 elsewhere,
    shaped like the (B, C) `logits` and in the rules' `dtype`."""
    relevance = torch.zeros(logits.shape, dtype=dtype, device=logits.device)
    return relevance.scatter_(1, classes[:, None].to(logits.device), 1.0)


def require_forward(module: nn.Module, expected: tuple[str, str], where: str) -> None:
    """`module` runs exactly the forward (module path, qualified name) the walk mirrors."""
    forward = type(module).forward
    if (forward.__module__, forward.__qualname__) != expected:
        raise UnsupportedModelError(
            f"no LRP rule for {type_name(module)} at {where}: the relevance rules follow "
            f"{expected[0]}.{expected[1].split('.')[0]}"
        )


def require_pass(module: nn.Module, where: str) -> None:
    if not passes_through(module):
        raise UnsupportedModelError(
            f"no LRP rule for {type_name(module)} at {where}: relevance passes only through "
            "Identity, LayerNorm, GELU, dropout and LayerScale modules"
        )


def require_linear(module: nn.Module, where: str, *, may_pass: bool = False) -> None:
    """nn.Linear (alpha-beta), also inside a LoRA or weight-only quantised wrapper
    (explain.lrp.weights); `may_pass` also accepts a pass-through head (Identity)."""
    if acts_as(module) is not nn.Linear and not (may_pass and passes_through(module)):
        raise UnsupportedModelError(
            f"no LRP rule for {type_name(module)} at {where}: the alpha-beta rule covers "
            "torch.nn.Linear"
        )
