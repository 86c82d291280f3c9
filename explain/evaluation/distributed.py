"""Running one evaluation on several processes (torchrun): which chunks are whose, and
how their records come together on rank 0.

Under `torchrun --nproc-per-node N` the environment names each process's RANK and the
WORLD_SIZE; chunk i belongs to rank i mod N. Records travel to rank 0 with
`gather_object` (gloo on CPU, nccl on GPU); rank 0 alone writes the results.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Group", "process_group"]


@dataclass(frozen=True)
class Group:
    """This process's place among the processes of one evaluation run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        """The device this rank should run its model on."""
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def owns(self, chunk: int) -> bool:
        return chunk % self.world_size == self.rank

    def gather(self, value: Any) -> list[Any] | None:
        """Every rank's `value`, in rank order, on rank 0 (None on the others)."""
        if self.world_size == 1:
            return [value]
        import torch.distributed as dist

        gathered: list[Any] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(value, gathered, dst=0)
        return gathered

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value` on every rank."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        holder = [value]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]


@contextlib.contextmanager
def process_group() -> Iterator[Group]:
    """The group of this run: torchrun's process group when launched by torchrun (joined
    on first use, left when the process exits); a single process otherwise."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        yield Group()
        return
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
            dist.init_process_group("nccl")
        else:
            dist.init_process_group("gloo")
        # Joined once per process and left at exit: destroying and re-creating the group
        # between two runs can hand a rank the stale address of the old group's peer.
        atexit.register(dist.destroy_process_group)
    yield Group(rank=rank, world_size=world_size, local_rank=local_rank)
