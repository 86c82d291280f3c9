"""The fused long-sequence fold: one block's step of a readout fold without N x N maps.

`readout_spread` computes, for the readout rows of C columns (classes, generated tokens),
`v @ Abar` with Abar the head mean of a block's attention A (rollout, raw attention) or
of `(dA * A)+` (Chefer et al.'s generic rule), recomputing A and dA from q, k, v and the
gradient dO of the attention output instead of reading stored maps. The identity term,
rollout's row normalisation and the order of the blocks stay with the fold that calls it
(explain.rules.fold).

Implementations: `torch_fold` (plain PyTorch, every device: chunks of query rows sized by
a memory budget, batched over columns, samples and heads) and, for CUDA tensors where
Triton is installed, `triton_fold` (FlashAttention-2-backward style tiles that never leave
the chip: no budget needed; float16, bfloat16 and float32 inputs). The same spread from
whole maps is the rules' own (explain.rules.fold.spread_maps); `live_rows` are the rows a
key mask leaves something to attend.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings
from typing import Any, Literal

import torch
from torch import Tensor

from explain.engine.kernels.torch_fold import live_rows
from explain.engine.kernels.torch_fold import readout_spread as _torch_readout_spread
from explain.rules.registry import SpreadMode

__all__ = [
    "DEFAULT_MAX_BYTES",
    "implementation",
    "live_rows",
    "readout_spread",
]

DEFAULT_MAX_BYTES = 256 << 20
"""Temporaries of the PyTorch implementation when the caller states no budget."""


def readout_spread(
    vector: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    output_grad: Tensor | None,
    *,
    scale: float,
    causal: bool,
    key_mask: Tensor | None,
    mode: SpreadMode,
    max_bytes: int | None = None,
) -> Tensor:
    """(C, B, N) float32: out[c, b, :] = vector[c, b, :] @ Abar[c, b].

    Args:
        vector: (C, B, N) readout rows, one per column.
        query: (B, Hq, N, D), the block's q as its attention kernel saw it (after rotary
            embeddings and the like).
        key: (B, Hk, Nk, D) with Hq % Hk == 0 (grouped-query attention: head h reads kv
            head h // (Hq // Hk)).
        value: (B, Hk, Nk, Dv).
        output_grad: (C, B, Hq, N, Dv), d score_c / d (attention output per head, before
            the output projection); None for mode "attention".
        scale: the factor of q k^T inside the softmax.
        causal: query i attends keys j <= i only (then Nk == N).
        key_mask: (B, Nk) bool, True where a key may be attended; None = every key. A
            query row with no key it may attend is a row of zeros, as sdpa gives it.
        mode: "gradient": Abar[c] = mean_h (dA_c * A)+ with dA_c = output_grad_c v^T;
            "attention": Abar = mean_h A, the same for every column.
        max_bytes: memory budget of the temporaries (PyTorch implementation; a kernel
            that tiles on chip needs none); None: `DEFAULT_MAX_BYTES`.
    """
    tensors = (vector, query, key, value, output_grad)
    options: dict[str, Any] = dict(scale=scale, causal=causal, key_mask=key_mask, mode=mode)
    if implementation(vector, query, key) == "triton":
        from triton.compiler.errors import CompilationError
        from triton.runtime.errors import OutOfResources

        from explain.engine.kernels.triton_fold import readout_spread as _triton_readout_spread

        try:
            return _triton_readout_spread(*tensors, **options)
        except (CompilationError, OutOfResources) as error:
            # Triton compiles per GPU architecture when first called; where it cannot (an
            # untested architecture, too little shared memory), the PyTorch fold gives the
            # same numbers at a higher cost. Said once per device, then remembered.
            _TRITON_FAILED.add(query.device)
            warnings.warn(
                f"explain: the Triton fold kernel could not run on {query.device} "
                f"({type(error).__name__}: {str(error)[:200]}); using the PyTorch fold",
                RuntimeWarning,
                stacklevel=2,
            )
    budget = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
    return _torch_readout_spread(*tensors, **options, max_bytes=budget)


def implementation(vector: Tensor, query: Tensor, key: Tensor) -> Literal["triton", "torch"]:
    """Which implementation `readout_spread` runs for these tensors: "triton" for CUDA
    tensors it takes (`_triton_takes`) on a device where the kernel has not failed,
    "torch" (torch_fold) everywhere else."""
    takes = _triton_takes(vector, query, key) and query.device not in _TRITON_FAILED
    return "triton" if takes else "torch"


_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_TRITON_FAILED: set[torch.device] = set()
"""Devices where the Triton kernel failed to compile or launch: they use `torch_fold`."""


def _triton_takes(vector: Tensor, query: Tensor, key: Tensor) -> bool:
    """CUDA tensors of the dtypes the Triton kernel takes, as many keys as queries (its
    masks assume self-attention), with Triton installed."""
    return (
        query.is_cuda
        and query.dtype in _TRITON_DTYPES
        and vector.dtype == torch.float32
        and key.shape[-2] == query.shape[-2]
        and _triton_installed()
    )


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None
