"""Wrapped models: DataParallel, DistributedDataParallel and torch.compile.

These wrappers hold the real model (`.module`, `._orig_mod`) and forward to it. An
explanation instruments and calls the wrapped model itself: its hooks and attention
switches belong on the real modules, a compiled graph would not run Python hooks, and
DistributedDataParallel's forward would take part in gradient synchronisation that an
explanation, which computes no parameter gradients, must not start. The wrapped model
runs on the device of its parameters (for DataParallel, the first device).
"""

from __future__ import annotations

from torch import nn

__all__ = ["unwrap"]


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside any nesting of DataParallel, DistributedDataParallel and
    torch.compile wrappers (the model itself when it is not wrapped)."""
    while True:
        if isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel):
            model = model.module
        elif _is_compiled(model):
            model = model._orig_mod
        else:
            return model


def _is_compiled(model: nn.Module) -> bool:
    """Whether `model` is torch.compile's wrapper, without importing torch._dynamo."""
    cls = type(model)
    return cls.__name__ == "OptimizedModule" and cls.__module__.startswith("torch._dynamo")
