"""Counting dispatched operations, the CPU stand-in for GPU kernel launches: on a GPU every
dispatched op is (at most) one launch, so a count that stays near the floor's keeps an
explanation near the cost of one forward and backward without timing anything.

The floor is one forward and one input-gradient backward of the same model on the same
inputs (`floor_ops`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

SYNCS = frozenset(
    {"_local_scalar_dense", "nonzero", "equal", "is_nonzero", "item", "_unique2", "unique_dim"}
)
"""Operations whose result the host reads: each waits for the device."""


class OpCounter(TorchDispatchMode):
    """Counts every ATen op dispatched while active, by name without overload (`ops`), in
    all (`total`), and the host syncs among them (`syncs`)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def syncs(self) -> int:
        return sum(self.ops[name] for name in SYNCS)


def count_ops(run: Callable[[], Any]) -> OpCounter:
    """The ops `run()` dispatches."""
    with OpCounter() as counter:
        run()
    return counter


def floor_ops(forward: Callable[[Tensor], Tensor], leaf: Tensor, target: int) -> OpCounter:
    """One forward from `leaf` (the input, or the embedding output for token ids) and one
    backward of each sample's `target` logit to it."""
    leaf = leaf.detach().requires_grad_(True)

    def run() -> None:
        logits = forward(leaf)
        torch.autograd.grad(logits[:, target].sum(), leaf)

    return count_ops(run)
