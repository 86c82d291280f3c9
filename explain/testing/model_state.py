"""A snapshot of everything an explanation promises not to change, and a comparison that
names what changed: parameters, `.grad` fields, `requires_grad`, modes, hooks (on the
model and global), attention-path flags and the global RNG states."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["ModelState", "hook_counts"]


_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


def hook_counts(model: nn.Module) -> dict[str, int]:
    """Number of hooks of every kind on every module, by 'module name/hook kind'."""
    counts = {}
    for name, module in model.named_modules():
        for kind in _HOOK_DICTS:
            hooks = getattr(module, kind, None)
            if hooks:
                counts[f"{name or '<root>'}/{kind}"] = len(hooks)
    return counts


def _global_hook_count() -> int:
    from torch.nn.modules import module as module_globals

    names = [n for n in dir(module_globals) if n.startswith("_global_") and n.endswith("hooks")]
    return sum(len(getattr(module_globals, n)) for n in names)


def _plain_attributes(model: nn.Module) -> Iterator[tuple[str, Any]]:
    """Boolean and string flags on modules (fused_attn, grad_checkpointing, ...)."""
    for name, module in model.named_modules():
        for key, value in vars(module).items():
            if not key.startswith("_") and isinstance(value, bool | str | int | float):
                yield f"{name or '<root>'}.{key}", value
        config = getattr(module, "config", None)
        if config is not None:
            for key in ("_attn_implementation", "attn_implementation"):
                if hasattr(config, key):
                    yield f"{name or '<root>'}.config.{key}", getattr(config, key)


def _same(a: Tensor, b: Tensor) -> bool:
    """Equal values; for tensors on the meta device (weights that accelerate offloads,
    whose values live in its weights map) the same shape and dtype, on meta both."""
    if a.is_meta or b.is_meta:
        return a.is_meta and b.is_meta and a.shape == b.shape and a.dtype == b.dtype
    return torch.equal(a, b)


@dataclass
class ModelState:
    """Everything an explanation call promises to leave unchanged."""

    parameters: dict[str, Tensor]
    grads: dict[str, Tensor | None]
    requires_grad: dict[str, bool]
    training: dict[str, bool]
    hooks: dict[str, int]
    global_hooks: int
    attributes: dict[str, Any]
    cpu_rng: Tensor
    cuda_rng: list[Tensor]

    @classmethod
    def capture(cls, model: nn.Module) -> ModelState:
        return cls(
            parameters={n: p.detach().clone() for n, p in model.named_parameters()},
            grads={
                n: None if p.grad is None else p.grad.detach().clone()
                for n, p in model.named_parameters()
            },
            requires_grad={n: p.requires_grad for n, p in model.named_parameters()},
            training={n: m.training for n, m in model.named_modules()},
            hooks=hook_counts(model),
            global_hooks=_global_hook_count(),
            attributes=dict(_plain_attributes(model)),
            cpu_rng=torch.get_rng_state(),
            cuda_rng=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        )

    def differences(self, other: ModelState) -> list[str]:
        """Human-readable list of what differs between two snapshots (empty if nothing)."""
        found = []
        for name, value in self.parameters.items():
            if not _same(value, other.parameters[name]):
                found.append(f"parameter {name} changed")
        for name, grad in self.grads.items():
            new = other.grads[name]
            if (grad is None) != (new is None) or (grad is not None and not torch.equal(grad, new)):
                found.append(f".grad of {name} changed")
        for label, mine, theirs in (
            ("requires_grad", self.requires_grad, other.requires_grad),
            ("training mode", self.training, other.training),
            ("hooks", self.hooks, other.hooks),
            ("attribute", self.attributes, other.attributes),
        ):
            for key in sorted(set(mine) | set(theirs)):
                if mine.get(key) != theirs.get(key):
                    found.append(f"{label} {key}: {mine.get(key)!r} -> {theirs.get(key)!r}")
        if self.global_hooks != other.global_hooks:
            found.append(f"global module hooks: {self.global_hooks} -> {other.global_hooks}")
        if not torch.equal(self.cpu_rng, other.cpu_rng):
            found.append("CPU RNG state changed")
        if len(self.cuda_rng) != len(other.cuda_rng) or any(
            not torch.equal(a, b) for a, b in zip(self.cuda_rng, other.cuda_rng, strict=False)
        ):
            found.append("CUDA RNG state changed")
        return found
