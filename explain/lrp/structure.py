"""What the per-family walks share: forward hooks that keep activations, the start of
every walk (relevance 1 at the class logit), and the checks that every module on the
propagation path has a rule (errors name the module type)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from explain.errors import UnsupportedModelError
from explain.layout import ModuleHook
from explain.lrp.rules import passes_through

__all__ = [
    "keep",
    "logit_relevance",
    "require_forward",
    "require_linear",
    "require_pass",
    "type_name",
]


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
    """nn.Linear (alpha-beta); `may_pass` also accepts a pass-through head (Identity)."""
    if type(module) is not nn.Linear and not (may_pass and passes_through(module)):
        raise UnsupportedModelError(
            f"no LRP rule for {type_name(module)} at {where}: the alpha-beta rule covers "
            "torch.nn.Linear"
        )
